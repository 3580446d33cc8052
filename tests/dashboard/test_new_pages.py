"""The Long context, Sizing and memory-budget views of the dashboard, through their
callbacks (no browser): registered in the navigation, figures drawn from the
recorded numbers, N/A where a run has none."""

from __future__ import annotations

import pytest

from kvscope.app.dashboard import sizing_page
from kvscope.app.dashboard.layout import PAGES
from kvscope.app.dashboard.long_context_page import NO_RETRIEVALS
from kvscope.app.dashboard.screenshots import DEMO_CONFIG
from kvscope.app.dashboard.server import create_app
from kvscope.db.infllm import retrievals
from kvscope.db.memory_budget import measured_budget
from kvscope.profiler.synthetic import record_synthetic

from support.dash_callbacks import call
from support.infllm_recording import record_infllm


@pytest.fixture(scope="module")
def infllm_app(tmp_path_factory):
    """A database with a synthetic run (#1: no retrievals, no budget) and an InfLLM run."""
    path = tmp_path_factory.mktemp("dash-infllm") / "runs.db"
    record_synthetic(path, DEMO_CONFIG, num_requests=8, num_pages=32, seed=3)
    run_id = record_infllm(path)
    return create_app(path), path, run_id


def test_pages_are_in_the_navigation():
    keys = [key for key, _, _ in PAGES]
    assert {"long-context", "sizing", "watch"} <= set(keys)


def test_long_context_draws_the_recorded_retrievals(infllm_app):
    app, path, run_id = infllm_app
    rows = retrievals(path, run_id)
    note, options, chosen, heatmap, resident = call(
        app, "long-context-note.children", None, run_id, 1
    )
    assert note is None
    assert [o["value"] for o in options] == [0, 1] and chosen == 1
    mine = [r for r in rows if r.request_id == 1]
    (trace,) = heatmap.data
    assert list(trace.x) == [r.step for r in mine]
    assert [trace.z[b][i] for i, r in enumerate(mine) for b in r.chosen] == [
        layers for r in mine for layers in r.chosen.values()
    ]
    lines = {t.name: t for t in resident.data}
    assert list(lines["req 1 offloaded"].y) == [r.offloaded_bytes / 2**20 for r in mine]


def test_long_context_without_retrievals_says_so(infllm_app):
    app, _, _ = infllm_app
    note, options, chosen, heatmap, _ = call(app, "long-context-note.children", None, 1, None)
    assert note.children == NO_RETRIEVALS
    assert (options, chosen) == ([], None)
    assert heatmap.layout.annotations[0].text == "no InfLLM retrievals for this request"


def test_sizing_page_is_calc_cliff(infllm_app):
    app, _, _ = infllm_app
    report = sizing_page.cliff("llama3-8b", "h100-80", "fp8_e4m3", 25)
    tiles, fig = call(app, "sizing-tiles.children", "llama3-8b", "h100-80", "fp8_e4m3", 25)
    assert [t.children[1].children for t in tiles] == [
        f"{report['compute_bound_batch']:,.0f}",
        *(f"cliff at {s['cliff_context_len']:,}" for s in report["scenarios"].values()),
    ]
    assert [t.name for t in fig.data] == list(report["scenarios"])
    assert set(report["scenarios"]) == {
        "fp16 KV",
        "fp8_e4m3 KV",
        "fp16 KV, InfLLM 25% resident",
        "fp8_e4m3 KV, InfLLM 25% resident",
    }
    # InfLLM at 25% resident holds 4x the batch at the same context.
    s = report["scenarios"]
    assert s["fp16 KV, InfLLM 25% resident"]["batch_at_input_output"] == pytest.approx(
        4 * s["fp16 KV"]["batch_at_input_output"], abs=2
    )
    no_infllm = sizing_page.cliff("llama3-8b", "h100-80", "int8", 0)
    assert list(no_infllm["scenarios"]) == ["fp16 KV", "int8 KV"]


def test_memory_budget_on_the_overview(infllm_app):
    app, path, run_id = infllm_app
    budget = measured_budget(path, run_id)
    card = call(app, "overview-budget.children", run_id)
    values = [tile.children[1].children for tile in card.children[1].children]
    assert values[3] == f"{budget.kv_bytes / 2**20:,.1f} MiB"
    assert len(values) == 5
    assert call(app, "overview-budget.children", 1) is None  # a run without one: nothing
