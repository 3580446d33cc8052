"""The Capacity page: two recorded ``kvscope replay --db`` sweeps, grouped by sweep id,
drawn as hit rate against capacity (the numbers the runs recorded), with the ceiling,
the miss-reason split per capacity, and the second sweep overlaid; no browser."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.app.cli import main
from kvscope.app.dashboard.capacity_page import (
    NO_SWEEPS,
    capacity_figure,
    miss_reasons_figure,
    miss_split_figure,
)
from kvscope.app.dashboard.layout import PAGES
from kvscope.app.dashboard.server import create_app
from kvscope.db.miss_reasons import run_miss_reasons
from kvscope.db.sweeps import list_sweeps, sweep

from support.dash_callbacks import call

SLICE = Path(__file__).parent.parent / "data" / "mooncake_conversation_head400.jsonl"


@pytest.fixture(scope="module")
def sweeps_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("capacity") / "sweeps.db"
    common = [str(SLICE), "--limit", "120", "--capacity", "1e4,1e5", "--db", str(db)]
    common += ["--quiet", "--workers", "1"]
    assert main(["replay", *common, "--eviction-policy", "lru,fifo"]) == 0
    assert main(["replay", *common, "--eviction-policy", "lru", "--page-size", "256"]) == 0
    return db


def test_runs_are_grouped_by_sweep_newest_first(sweeps_db):
    newer, older = list_sweeps(sweeps_db)
    assert len(older.points) == 5 and len(newer.points) == 3  # 2 x 2 + ceiling; 2 + ceiling
    assert {p.policy for p in older.points} == {"lru", "fifo"}
    assert {p.page_size for p in newer.points} == {256}
    assert older.ceiling(512) is not None and older.ceiling(256) is None


def test_curves_and_ceiling_are_the_recorded_hit_rates(sweeps_db):
    newer, older = list_sweeps(sweeps_db)
    fig = capacity_figure([older, newer])
    lines = {t.name: t for t in fig.data}
    lru = sorted(
        (p.capacity_tokens, p.hit_rate)
        for p in older.points
        if p.policy == "lru" and p.capacity_tokens is not None
    )
    solid = lines[f"lru (page 512) · {older.sweep_id}"]
    assert list(solid.x) == [c for c, _ in lru] == [10_000, 100_000]
    assert list(solid.y) == pytest.approx([100 * r for _, r in lru])
    assert solid.line.dash == "solid"
    assert lines[f"lru (page 256) · {newer.sweep_id}"].line.dash == "dash"
    ceilings = [s.y0 for s in fig.layout.shapes]
    assert ceilings == pytest.approx([100 * older.ceiling(512), 100 * newer.ceiling(256)])
    assert capacity_figure([]).layout.annotations[0].text == NO_SWEEPS


def test_miss_split_shares_sum_to_the_missed_tokens(sweeps_db):
    older = list_sweeps(sweeps_db)[1]
    full = sweep(sweeps_db, older.sweep_id)
    fig = miss_split_figure(full)
    bars = {t.name: t for t in fig.data}
    assert list(bars["cold"].x) == ["10,000", "100,000", "unlimited"]  # lru: the first policy
    totals = [sum(bars[name].y[i] for name in bars) for i in range(3)]
    assert totals == pytest.approx([100, 100, 100])
    assert bars["capacity"].y[2] == 0  # nothing is evicted at unlimited capacity
    unlimited = next(p for p in full.points if p.capacity_tokens is None)
    assert bars["cold"].customdata[2] == unlimited.misses.cold
    counts = run_miss_reasons(sweeps_db, unlimited.run_id)
    one = miss_reasons_figure(counts)
    assert [t.x[0] for t in one.data] == [
        counts.cold,
        counts.capacity,
        counts.granularity,
        counts.last_token,
    ]


def test_the_page_is_registered_and_its_callback_draws_the_chosen_sweeps(sweeps_db):
    assert "capacity" in [key for key, _, _ in PAGES]
    app = create_app(sweeps_db)
    newer, older = list_sweeps(sweeps_db)
    first_run = older.points[0].run_id
    options, value, compare, curves, misses = call(
        app, "capacity-sweep.options", None, None, None, first_run
    )
    assert value == older.sweep_id  # the chosen run's sweep
    assert [o["value"] for o in options] == [newer.sweep_id, older.sweep_id]
    assert [o["value"] for o in compare] == [newer.sweep_id]
    assert len(misses.data) == 4
    _, _, _, both, _ = call(
        app, "capacity-sweep.options", None, older.sweep_id, [newer.sweep_id], first_run
    )
    assert len(both.data) == len(curves.data) + 1  # the other sweep's lru curve
