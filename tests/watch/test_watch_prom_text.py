"""The Prometheus text parser on vLLM's and SGLang's real exposition text."""

from __future__ import annotations

import math

import pytest

from kvscope.profiler.watch.prom_text import label_text, parse, parse_labels
from kvscope.profiler.watch.scraper import sample_rows

VLLM_TEXT = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.4375
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 96.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny"} 1.7e9
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.5
vllm:cache_config_info{block_size="32",num_gpu_blocks="10",engine="0"} 1.0
sglang:token_usage{model_name="m, \\"quoted\\"\\nline"} 0.25 1700000000000
process_cpu_seconds_total 12.5
python_info{implementation="CPython"} NaN
"""


def test_parses_names_labels_values() -> None:
    samples = {(s.name, s.labels.get("le")): s for s in parse(VLLM_TEXT)}
    assert samples[("vllm:kv_cache_usage_perc", None)].value == 0.4375
    assert samples[("vllm:kv_cache_usage_perc", None)].labels == {
        "engine": "0",
        "model_name": "tiny",
    }
    assert samples[("vllm:time_to_first_token_seconds_bucket", "+Inf")].value == 4.0
    assert samples[("sglang:token_usage", None)].labels["model_name"] == 'm, "quoted"\nline'
    assert samples[("sglang:token_usage", None)].value == 0.25  # timestamp ignored
    assert samples[("process_cpu_seconds_total", None)].value == 12.5
    assert math.isnan(samples[("python_info", None)].value)


def test_rows_keep_engine_samples_without_buckets() -> None:
    rows = sample_rows(3, 99, VLLM_TEXT)
    names = [row[2] for row in rows]
    assert names == [
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:cache_config_info",
        "sglang:token_usage",
    ]
    assert rows[0] == (3, 99, "vllm:kv_cache_usage_perc", 'engine="0",model_name="tiny"', 0.4375)
    assert label_text({"b": "2", "a": "1"}) == 'a="1",b="2"'


def test_stored_labels_read_back() -> None:
    labels = {"model_name": 'm, "quoted"\\x\nline', "engine": "0"}
    assert parse_labels(label_text(labels)) == labels


@pytest.mark.parametrize("line", ["vllm:x{a=1} 2", 'vllm:x{a="1"}', "vllm:x notanumber"])
def test_malformed_lines_raise(line: str) -> None:
    with pytest.raises(ValueError):
        parse(line)


def test_a_port_that_answers_but_not_in_http_is_a_scrape_error():
    """The events' ZMQ port given as --metrics answers bytes that are no HTTP status
    line: counted as a failed scrape, with its incident, not a dead scraper thread."""
    import socket
    import threading

    from kvscope.profiler.watch.scraper import Scraper

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(4096)
        conn.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f not http\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    incidents = []
    scraper = Scraper(
        [(0, f"http://127.0.0.1:{port}/metrics")], print, lambda s, m: incidents.append(m)
    )
    try:
        scraper.scrape_once()
    finally:
        thread.join(5)
        server.close()
    assert (scraper.scrapes, scraper.errors) == (0, 1)
    assert len(incidents) == 1 and f"127.0.0.1:{port}" in incidents[0]
