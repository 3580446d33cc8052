"""The HTML report shows the engine's measured memory budget beside calc's prediction,
and nothing for a run that recorded none."""

from __future__ import annotations

from kvscope.app.report.html import build_html
from kvscope.db.memory_budget import measured_budget
from kvscope.db.source import reader

from support.infllm_recording import record_infllm


def test_budget_tiles_in_the_report(tmp_path, synthetic_db):
    path = tmp_path / "run.db"
    run_id = record_infllm(path)
    budget = measured_budget(path, run_id)
    assert budget is not None and not budget.activations_measured
    assert [term for term, _, _ in budget.terms()] == [
        "weights",
        "activations",
        "framework overhead",
        "KV cache",
        "KV cache, calc predicts",
    ]
    with reader(path) as db:
        page = build_html(db, run_id)
    assert "Memory budget on cpu (90% of" in page
    assert f"{budget.kv_bytes / 2**20:,.1f} MiB" in page  # the KV cache tile
    assert "measured / predicted" in page
    old_path, old_run, _ = synthetic_db  # recorded without the event
    with reader(old_path) as db:
        assert "Memory budget" not in build_html(db, old_run)
