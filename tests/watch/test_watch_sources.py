"""Endpoints per data-parallel rank, endpoint checks, sequence verdicts, SGLang discovery."""

from __future__ import annotations

import pytest

from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.discovery import sources_from_info
from kvscope.profiler.watch.sequence import SequenceTracker, Verdict
from kvscope.profiler.watch.sources import expand_sources


def test_tcp_ranks_take_base_port_plus_rank() -> None:
    specs = expand_sources(
        "tcp://gpu-node-1:5557", replay="tcp://gpu-node-1:5600", dp_size=3, topic="kv"
    )
    assert [(s.endpoint, s.replay, s.dp_rank, s.topic) for s in specs] == [
        ("tcp://gpu-node-1:5557", "tcp://gpu-node-1:5600", 0, "kv"),
        ("tcp://gpu-node-1:5558", "tcp://gpu-node-1:5601", 1, "kv"),
        ("tcp://gpu-node-1:5559", "tcp://gpu-node-1:5602", 2, "kv"),
    ]
    assert expand_sources("tcp://h:5557")[0].dp_rank is None  # no DP: no rank


def test_ipc_ranks_take_a_suffix() -> None:
    specs = expand_sources("ipc:///tmp/kv", dp_size=2, engine="sglang")
    assert [s.endpoint for s in specs] == ["ipc:///tmp/kv", "ipc:///tmp/kv_dp1"]
    assert {s.engine for s in specs} == {"sglang"}


def test_listening_binds_a_port_per_rank() -> None:
    # vLLM offsets a connecting endpoint by rank too, so each rank pushes to its own port.
    specs = expand_sources("tcp://127.0.0.1:5557", dp_size=2, listen=True)
    assert [(s.endpoint, s.dp_rank, s.listen) for s in specs] == [
        ("tcp://127.0.0.1:5557", 0, True),
        ("tcp://127.0.0.1:5558", 1, True),
    ]


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("http://h:1", "must start with"),
        ("tcp://h", "needs a host and a port"),
        ("tcp://:5557", "needs a host and a port"),
        ("tcp://h:70000", "out of range"),
    ],
)
def test_bad_endpoints(endpoint: str, message: str) -> None:
    with pytest.raises(KvscopeError, match=message):
        expand_sources(endpoint)


def test_bad_engine_dp_size_and_port_overflow() -> None:
    with pytest.raises(KvscopeError, match="engine must be"):
        expand_sources("tcp://h:1", engine="trt")
    with pytest.raises(KvscopeError, match="at least 1"):
        expand_sources("tcp://h:1", dp_size=0)
    with pytest.raises(KvscopeError, match="> 65535"):
        expand_sources("tcp://h:65535", dp_size=2)


def test_sequence_verdicts() -> None:
    t = SequenceTracker()
    assert t.classify(7) is Verdict.NEXT  # joining mid-stream is not a gap
    t.accept(7)
    assert t.classify(8) is Verdict.NEXT
    assert t.classify(10) is Verdict.GAP and t.expected == 8
    assert t.classify(7) is Verdict.DUPLICATE
    assert t.classify(3) is Verdict.RESTART
    t.reset()
    assert t.expected == 0
    assert t.classify(0) is Verdict.NEXT and t.classify(2) is Verdict.GAP


def test_sglang_server_info_discovery() -> None:
    info = {
        "kv_events": {
            "endpoint_host": "*",
            "endpoint_port_base": 6000,
            "topic": "kv",
            "block_size": 16,
            "dp_size": 2,
            "replay_endpoint_port_base": 6100,
        }
    }
    specs = sources_from_info("http://node7:30000/server_info", info)
    assert [(s.endpoint, s.replay, s.dp_rank, s.engine, s.topic) for s in specs] == [
        ("tcp://node7:6000", "tcp://node7:6100", 0, "sglang", "kv"),
        ("tcp://node7:6001", "tcp://node7:6101", 1, "sglang", "kv"),
    ]
    with pytest.raises(KvscopeError, match="advertises no kv_events"):
        sources_from_info("http://h/server_info", {"model_path": "x"})


@pytest.mark.parametrize(
    ("field", "value"),
    [("endpoint_port_base", "abc"), ("endpoint_port_base", [1]), ("endpoint_port_base", 1e400),
     ("endpoint_port_base", 5557.5), ("dp_size", "x"), ("replay_endpoint_port_base", "r"),
     ("dp_size", True)],
)  # fmt: skip
def test_a_server_info_field_that_is_no_whole_number_is_one_error(field: str, value) -> None:
    """A malformed /server_info had ended the watch in a traceback (ValueError,
    TypeError, OverflowError from int())."""
    events = {"endpoint_port_base": 5557} | {field: value}
    with pytest.raises(KvscopeError, match=f"kv_events {field} = .*not a whole number"):
        sources_from_info("http://h:1/server_info", {"kv_events": events})
    text = {"endpoint_port_base": "5557", "dp_size": 2.0, "replay_endpoint_port_base": "5600"}
    specs = sources_from_info("http://h:1/server_info", {"kv_events": text})
    assert [(s.endpoint, s.replay) for s in specs] == [
        ("tcp://h:5557", "tcp://h:5600"), ("tcp://h:5558", "tcp://h:5601")]  # fmt: skip
