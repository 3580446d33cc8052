"""The Perfetto trace: valid Chrome Trace Event JSON whose events match the run."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from kvscope.app.cli import main
from kvscope.app.report.trace import ENGINE_PID, KERNELS_PID, REQUESTS_PID
from kvscope.engine.events import KernelTiming, RequestArrived, RequestPreempted


@pytest.fixture(scope="module")
def trace(synthetic_db, tmp_path_factory):
    path, run_id, _ = synthetic_db
    out = tmp_path_factory.mktemp("trace") / "run.trace.json"
    assert (
        main(["report", str(path), "--run", str(run_id), "--format", "trace", "-o", str(out)]) == 0
    )
    return json.loads(out.read_text())


def _timed(trace):
    return [e for e in trace["traceEvents"] if e["ph"] != "M"]


def test_every_event_has_the_required_fields(trace):
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert {"name", "ph", "pid"} <= event.keys()
        assert event["ph"] in {"M", "X", "i", "C"}
        if event["ph"] in {"i", "C"} or event.get("cat") == "request":
            assert event["ts"] >= 0  # since the run's start
        if event["ph"] == "X":  # a kernel stamped at its end may have started earlier
            assert event["ts"] + event["dur"] >= 0
        if event["ph"] in {"X", "i"}:
            assert isinstance(event["tid"], int)
        if event["ph"] == "X":
            assert event["dur"] >= 0
        if event["ph"] == "C":
            assert event["args"] and all(isinstance(v, float | int) for v in event["args"].values())


def test_events_are_in_time_order_after_metadata(trace):
    phases = [e["ph"] for e in trace["traceEvents"]]
    assert phases == sorted(phases, key=lambda ph: ph != "M")
    stamps = [e["ts"] for e in _timed(trace)]
    assert stamps == sorted(stamps)


def test_kernel_slices_match_the_recorded_kernels(trace, synthetic_db):
    _, _, run = synthetic_db
    kernels = [e for e in _timed(trace) if e["pid"] == KERNELS_PID]
    truth = [e for e in run.events if isinstance(e, KernelTiming)]
    assert len(kernels) == len(truth)
    assert {e["name"] for e in kernels} == set(run.truth.kernel_calls)
    by_name = defaultdict(float)
    for e in kernels:
        by_name[e["name"]] += e["dur"]
    for name, seconds in by_name.items():
        expected = sum(k.seconds for k in truth if k.name == name)
        assert seconds == pytest.approx(expected * 1e6, rel=1e-6)  # microseconds
    tracks = {
        m["args"]["name"]
        for m in trace["traceEvents"]
        if m["ph"] == "M" and m["pid"] == KERNELS_PID
    }
    assert {"kernels", *run.truth.kernel_calls} == tracks


def test_request_slices_nest_their_phases(trace, synthetic_db):
    _, _, run = synthetic_db
    slices = [e for e in _timed(trace) if e["pid"] == REQUESTS_PID and e["ph"] == "X"]
    requests = {e["tid"]: e for e in slices if e["name"].startswith("request ")}
    assert len(requests) == sum(isinstance(e, RequestArrived) for e in run.events)
    for phase in (e for e in slices if not e["name"].startswith("request ")):
        parent = requests[phase["tid"]]
        assert phase["name"] in {"queued", "prefill", "decode"}
        assert parent["ts"] <= phase["ts"]
        assert phase["ts"] + phase["dur"] <= parent["ts"] + parent["dur"]
    preempted = [e for e in _timed(trace) if e["ph"] == "i" and e["name"] == "preempted"]
    assert len(preempted) == sum(isinstance(e, RequestPreempted) for e in run.events)
    assert all(e["tid"] in requests for e in preempted)


def test_counters_cover_usage_hit_rate_and_queues(trace):
    counters = [e for e in _timed(trace) if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {ENGINE_PID}
    names = {e["name"] for e in counters}
    assert {"KV usage (%)", "prefix hit rate (%)", "queues", "pages"} <= names
    for e in counters:
        if e["name"] == "KV usage (%)":
            assert all(0 <= v <= 100 for v in e["args"].values())
