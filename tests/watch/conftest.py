"""Fixtures for the watch tests: in-process publishers on loopback, and a
hand-built recording whose every derived figure is known."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_CLEARED, OP_REMOVED, OP_STORED
from kvscope.profiler.watch.publisher import EventPublisher
from kvscope.profiler.watch.writer import WatchWriter

from support.watch_helpers import A, B, C, D, E, S, new_watch_run


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
