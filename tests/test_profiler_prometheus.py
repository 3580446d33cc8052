"""The Prometheus endpoint: vLLM-aligned names, valid text format, localhost by default."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import FirstToken, PrefixLookup, RequestPreempted, StepSummary
from kvscope.profiler.metrics import LiveMetrics
from kvscope.profiler.prometheus import MetricsServer, render


def _metrics() -> LiveMetrics:
    live = LiveMetrics(start_ns=0)
    live.on_event(PrefixLookup(1, 0, 1, queried_tokens=64, hit_tokens=48))
    live.on_event(RequestPreempted(2, 0, 1, "recompute", 3))
    live.on_event(FirstToken(3, 0, 1, 0.03))
    live.on_event(StepSummary(int(1e9), 0, 3, 0, 3, 3, 2, 20, 5, 2, 13, 16, 70, 0, 0.02))
    return live


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_render_has_vllm_names_and_values() -> None:
    text = render(_metrics(), model="smol")
    samples = _samples(text)
    label = '{model_name="smol"}'
    assert samples[f"kvscope:kv_cache_usage_perc{label}"] == pytest.approx(5 / 20)
    assert samples[f"kvscope:kv_cache_token_usage_perc{label}"] == pytest.approx(70 / 80)
    assert samples[f"kvscope:prefix_cache_queries_total{label}"] == 64
    assert samples[f"kvscope:prefix_cache_hits_total{label}"] == 48
    assert samples[f"kvscope:num_preemptions_total{label}"] == 1
    assert samples[f"kvscope:num_requests_running{label}"] == 3
    assert samples[f"kvscope:num_requests_waiting{label}"] == 2
    assert "# TYPE kvscope:prefix_cache_hits_total counter" in text
    assert "# TYPE kvscope:time_to_first_token_seconds histogram" in text
    ttft = 'kvscope:time_to_first_token_seconds_bucket{model_name="smol",le='
    assert samples[ttft + '"0.02"}'] == 0 and samples[ttft + '"0.04"}'] == 1
    assert samples[ttft + '"+Inf"}'] == samples[f"kvscope:time_to_first_token_seconds_count{label}"]
    itl = [
        v for k, v in samples.items() if k.startswith("kvscope:inter_token_latency_seconds_bucket")
    ]
    assert itl == sorted(itl) and itl[-1] == 3  # cumulative; 3 decode tokens observed


def test_server_serves_on_localhost_and_reports_bind_errors() -> None:
    live = _metrics()
    server = MetricsServer(live, port=0, model="smol")
    try:
        assert server.host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = resp.read().decode()
        assert body == render(live, model="smol")
        live.on_event(PrefixLookup(5, 1, 2, queried_tokens=10, hit_tokens=10))
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=5) as resp:
            assert 'kvscope:prefix_cache_hits_total{model_name="smol"} 58.0' in resp.read().decode()
        with pytest.raises(KvscopeError, match=f"cannot serve metrics on 127.0.0.1:{server.port}"):
            MetricsServer(live, port=server.port)
    finally:
        server.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=1):
        pass
