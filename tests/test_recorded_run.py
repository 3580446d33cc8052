"""A real engine run recorded to SQLite: the database's counters equal the engine's own."""

from __future__ import annotations

import threading

import pytest

from kvscope.app.run_job import drive
from kvscope.app.workloads import builtin
from kvscope.db import queries
from kvscope.profiler.recorder import Recorder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded(make_engine, tmp_path_factory):
    db = tmp_path_factory.mktemp("run") / "run.db"
    engine = make_engine(kv_budget_bytes=24 << 20, offload="auto", page_map_every=1)
    kinds: dict[str, int] = {}
    engine.bus.subscribe(lambda e: kinds.__setitem__(e.kind, kinds.get(e.kind, 0) + 1))
    recorder = Recorder(db, {"test": True}, model="smollm2")
    engine.bus.subscribe(recorder.on_event)
    recorder.start()
    drive(engine, builtin("chat", 12, rate=0.0), threading.Event())
    summary = recorder.finish("complete")
    return engine, kinds, db, recorder.run_id, summary


def test_counters_match_engine(recorded):
    engine, kinds, db, run_id, summary = recorded
    finished = [r for r in engine.requests.values() if r.is_finished]
    assert summary.requests == summary.requests_finished == len(finished) == 12
    assert (
        summary.output_tokens
        == sum(len(r.output_ids) for r in finished)
        == engine.total_output_tokens
    )
    assert summary.prefix_hit_tokens == engine.kv.prefix_hit_tokens > 0
    assert summary.prefix_queried_tokens == engine.kv.prefix_queried_tokens
    assert summary.evicted_pages == kinds["page_evicted"] > 0
    assert summary.offloaded_pages == kinds["page_offloaded"]
    assert (
        summary.preemptions
        == sum(r.num_preemptions for r in finished)
        == kinds["request_preempted"]
        > 0
    )
    assert summary.steps == engine.step_count
    assert summary.dropped_events == 0


def test_page_maps_agree_with_page_events(recorded):
    engine, _, db, run_id, _ = recorded
    balances = queries.page_accounting(db, run_id)
    assert len(balances) >= engine.step_count - 1
    assert all(b.referenced == b.owned for b in balances)


def test_requests_table(recorded):
    engine, _, db, run_id, _ = recorded
    rows = {r.request_id: r for r in queries.requests_table(db, run_id)}
    for req in engine.requests.values():
        row = rows[req.request_id]
        assert row.prompt_tokens == len(req.prompt_ids)
        assert row.output_tokens == len(req.output_ids)
        assert row.cached_tokens == req.num_cached
        assert row.preemptions == req.num_preemptions
