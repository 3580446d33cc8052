"""Prometheus exposition of the live metrics, with vLLM's metric names.

A plain ``http.server`` in a daemon thread serves the text format (0.0.4) at
any path, bound to 127.0.0.1 unless told otherwise. Names mirror vLLM's
(``vllm:`` becomes ``kvscope:``) so existing dashboards and alerts carry over;
``kvscope:kv_cache_token_usage_perc`` is ours: token-level usage, which vLLM lacks.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvscope.engine.errors import KvscopeError
from kvscope.profiler.metrics import Histogram, LiveMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labels(model: str, extra: str = "") -> str:
    escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + f'model_name="{escaped}"' + (f",{extra}" if extra else "") + "}"


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def render(metrics: LiveMetrics, model: str = "") -> str:
    """The metrics in Prometheus text format."""
    lines: list[str] = []
    labels = _labels(model)

    def sample(name: str, kind: str, help_text: str, value: float | None) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {_number(value if value is not None else 0.0)}")

    def histogram(name: str, help_text: str, hist: Histogram) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} histogram")
        for bound, count in hist.cumulative():
            le = 'le="' + _number(bound) + '"'
            lines.append(f"{name}_bucket{_labels(model, le)} {count}")
        lines.append(f"{name}_sum{labels} {_number(hist.sum)}")
        lines.append(f"{name}_count{labels} {hist.count}")

    t = metrics.totals
    step = metrics.last_step
    sample(
        "kvscope:kv_cache_usage_perc",
        "gauge",
        "KV-cache page usage: pages held by requests / all pages (1 = 100%).",
        metrics.page_usage(),
    )
    sample(
        "kvscope:kv_cache_token_usage_perc",
        "gauge",
        "KV-cache token usage: tokens held / token slots of the used pages (1 = 100%).",
        metrics.token_usage(),
    )
    sample("kvscope:num_requests_running", "gauge", "Requests in the running batch.",
           step.running if step else 0)  # fmt: skip
    sample("kvscope:num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
           step.waiting if step else 0)  # fmt: skip
    sample(
        "kvscope:prefix_cache_queries_total",
        "counter",
        "Prefix-cache queries, in tokens.",
        t.prefix_queried_tokens,
    )
    sample(
        "kvscope:prefix_cache_hits_total",
        "counter",
        "Prefix-cache hits, in tokens.",
        t.prefix_hit_tokens,
    )
    sample("kvscope:num_preemptions_total", "counter", "Preemptions.", t.preemptions)
    histogram(
        "kvscope:time_to_first_token_seconds",
        "Time to first token in seconds.",
        metrics.ttft,
    )
    histogram(
        "kvscope:inter_token_latency_seconds",
        "Time between successive output tokens of a request, in seconds.",
        metrics.inter_token_latency,
    )
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``render(metrics)`` over HTTP until ``close()``.

    ``port=0`` picks a free port; ``self.port`` tells which. Raises
    KvscopeError when the address cannot be bound.
    """

    def __init__(
        self, metrics: LiveMetrics, port: int, host: str = "127.0.0.1", model: str = ""
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = render(metrics, model).encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes every few seconds must not write to the terminal

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise KvscopeError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kvscope-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
