"""Fixtures for the watch tests: in-process publishers on loopback, a /metrics
server whose counters grow by a known step each scrape, and a hand-built recording
whose every derived figure is known."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_CLEARED, OP_REMOVED, OP_STORED
from kvscope.profiler.watch.publisher import EventPublisher
from kvscope.profiler.watch.writer import WatchWriter

from support.watch_helpers import A, B, C, D, E, S, new_watch_run


class MetricsText:
    """A /metrics endpoint whose counters move by fixed steps per scrape."""

    def __init__(self) -> None:
        self.scrapes = 0

    def text(self) -> str:
        n = self.scrapes
        self.scrapes += 1
        return (
            "# TYPE vllm:prefix_cache_queries_total counter\n"
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {100.0 * n}\n'
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {25.0 * n}\n'
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {0.1 * (n % 5)}\n'
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {n}\n'
            f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {0.2 * n}\n'
            f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {4.0 * n}\n'
        )


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, MetricsText]]:
    metrics = MetricsText()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = metrics.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics", metrics
    server.shutdown()
    server.server_close()


@pytest.fixture
def publishers() -> Iterator[Callable[..., EventPublisher]]:
    """Make publishers (closed at the end of the test)."""
    made: list[EventPublisher] = []

    def make(endpoint: str = "tcp://127.0.0.1:*", **kwargs) -> EventPublisher:
        pub = EventPublisher(endpoint, **kwargs)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close()


def _event(source: int, seq: int, t_s: float, op: int, hashes=(), parent=None, medium="GPU"):
    text = None if op == OP_CLEARED else "[" + ",".join(map(str, hashes)) + "]"
    return (source, seq, int(t_s * S), op, text, parent, medium, 0, len(hashes))


@pytest.fixture
def recording(tmp_path: Path) -> tuple[Path, int]:
    """A hand-built watch run whose every derived figure is known (see test_watch_queries)."""
    path = tmp_path / "w.db"
    db, run_id = new_watch_run(path)
    writer = WatchWriter(db, run_id)
    sources = [
        (0, "events", "vllm", "tcp://a:1", None, "", None, 0),
        (1, "events", "vllm", "tcp://b:1", None, "", None, 0),
        (2, "events", "sglang", "tcp://c:1", None, "", None, 0),
    ]
    blocks = [
        _event(0, 0, 1.0, OP_STORED, [A, B, C]),
        _event(1, 0, 1.5, OP_STORED, [A, B]),
        _event(2, 0, 1.6, OP_STORED, [A]),  # same number, other engine kind: not a duplicate
        _event(0, 1, 2.0, OP_STORED, [D], parent=B),
        _event(0, 2, 2.5, OP_STORED, [B], parent=A, medium="CPU"),
        _event(0, 3, 3.0, OP_REMOVED, [A]),
        _event(0, 4, 4.0, OP_STORED, [A]),  # recomputed after its eviction
        _event(0, 5, 5.0, OP_STORED, [C], parent=B),  # re-announced: still cached
        _event(0, 6, 6.0, OP_CLEARED),
        _event(0, 7, 7.0, OP_STORED, [E]),
    ]
    counters = [
        (16, 7, 8, 8, 9, 0, 0, 0, 0, 0, 0, "{}", 0),
        (16, 0, 1, 1, 2, 0, 0, 0, 0, 0, 0, "{}", 1),
        (4, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, "{}", 2),
    ]
    writer.write(WatchBatch(sources=sources, blocks=blocks, counters=counters))
    db.conn.close()
    return path, run_id
