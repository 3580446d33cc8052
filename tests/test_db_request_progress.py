"""A running request's progress derived from a real engine's events: at the step
each request finished it equals what the engine counted, through preemptions."""

from __future__ import annotations

import threading

import pytest

from kvscope.app.run_job import drive
from kvscope.app.workloads import builtin
from kvscope.db.requests import request_progress
from kvscope.db.source import Position
from kvscope.db.store import open_db
from kvscope.engine.events import RequestFinished
from kvscope.profiler.recorder import Recorder

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_progress_at_the_finish_step_equals_the_engines_count(
    make_engine, tmp_path, preemption
) -> None:
    db = tmp_path / "run.db"
    engine = make_engine(
        kv_budget_bytes=16 << 20, offload="auto", preemption=preemption, max_batched_tokens=256
    )
    finished: list[RequestFinished] = []
    engine.bus.subscribe(lambda e: finished.append(e) if isinstance(e, RequestFinished) else None)
    recorder = Recorder(db, {"test": True}, model="smollm2")
    engine.bus.subscribe(recorder.on_event)
    recorder.start()
    drive(engine, builtin("chat", 6, rate=0.0), threading.Event())
    recorder.finish("complete")
    assert len(finished) == 6
    assert sum(r.num_preemptions for r in engine.requests.values()) > 0
    conn = open_db(db, create=False).conn
    for e in finished:
        req = engine.requests[e.request_id]
        (progress,) = request_progress(
            conn, Position(recorder.run_id, e.step, e.ts_ns), [e.request_id]
        ).values()
        assert progress.output_tokens == len(req.output_ids), (e.request_id, req.num_preemptions)
        assert progress.tpot_s == pytest.approx(e.tpot_s, rel=1e-6)
    conn.close()
