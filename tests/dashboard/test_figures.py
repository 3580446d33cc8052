"""Figure builders: the numbers in a figure are the numbers in the database."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.app.dashboard import figures
from kvscope.db import queries
from kvscope.db.pages import dominant_owners
from kvscope.db.queries import (
    compare_runs,
    gpu_series,
    kernel_stats,
    page_maps,
    run_info,
    run_summary,
    step_series,
)
from kvscope.engine.events import KernelTiming, RequestPreempted


@pytest.fixture(scope="module")
def db(synthetic_db):
    with queries.reader(synthetic_db[0]) as db:
        yield db


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def _annotations(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_summary_tiles_show_the_true_counts(db, synthetic_db):
    _, run_id, run = synthetic_db
    tiles = {t.label: t for t in figures.summary_tiles(run_summary(db, run_id))}
    truth = run.truth
    assert tiles["evictions"].value == str(truth.evicted_pages)
    assert tiles["evictions"].detail == (
        f"{truth.offloaded_pages} offloaded, {truth.reloaded_pages} reloaded"
    )
    assert tiles["preemptions"].value == str(truth.preemptions)
    assert tiles["requests"].value == f"{truth.requests_finished} / {truth.requests}"
    rate = 100 * truth.prefix_hit_tokens / truth.prefix_queried_tokens
    assert tiles["prefix hit rate"].value == f"{rate:.1f}%"
    assert tiles["output tokens/s"].detail.startswith(f"{truth.output_tokens} tokens")


def test_time_series_figures_plot_the_step_series(db, synthetic_db):
    _, run_id, _ = synthetic_db
    points = step_series(db, run_id, 50)
    throughput = figures.throughput_figure(points)
    assert list(_trace(throughput, "decode").y) == [p.decode_tokens_per_s for p in points]
    assert list(_trace(throughput, "decode").x) == [p.t_s for p in points]
    usage = figures.usage_figure(points)
    assert list(_trace(usage, "token usage").y) == [100 * p.token_usage for p in points]
    assert list(_trace(usage, "page usage").y) == [100 * p.page_usage for p in points]
    frag = figures.fragmentation_figure(points)
    assert list(frag.data[0].y) == [p.fragmentation_slots for p in points]
    queues = figures.queue_figure(points)
    assert list(_trace(queues, "waiting").y) == [p.waiting for p in points]


def test_hit_rate_figure_per_bucket_and_since_start(db, synthetic_db):
    _, run_id, run = synthetic_db
    points = step_series(db, run_id, 30)
    fig = figures.hit_rate_figure(points)
    per_bucket = list(_trace(fig, "hit rate").y)
    assert per_bucket == [None if p.hit_rate is None else 100 * p.hit_rate for p in points]
    final = list(_trace(fig, "since start").y)[-1]
    assert final == pytest.approx(
        100 * run.truth.prefix_hit_tokens / run.truth.prefix_queried_tokens
    )


def test_page_heatmap_colours_each_page_by_its_state(db, synthetic_db):
    _, run_id, run = synthetic_db
    matrix = page_maps(db, run_id)
    fig = figures.page_heatmap(matrix)
    heat = fig.data[0]
    z = np.asarray(heat.z)
    in_use = len(figures.PAGE_STATES)
    for j, step in enumerate(matrix.steps):
        assert int((z[:, j] >= in_use).sum()) == run.truth.pages_in_use_at_snapshot[step]
    owners = matrix.owners
    for code, owner in ((0, -1), (1, -3), (2, -2)):  # free, evicted, cached
        assert ((z == code) == (owners == owner)).all()
    assert (z == 2).any()
    page, snap = np.argwhere(owners >= 0)[0]
    assert np.asarray(heat.customdata)[page, snap] == owners[page, snap]
    free = np.argwhere(owners == -1)[0]
    assert np.asarray(heat.customdata)[tuple(free)] == "free"
    assert list(heat.x) == matrix.steps


def test_page_heatmap_with_a_page_stride(db, synthetic_db):
    _, run_id, _ = synthetic_db
    matrix = page_maps(db, run_id, max_snapshots=10, max_pages=16)
    fig = figures.page_heatmap(matrix)
    assert matrix.page_stride == 3
    assert list(fig.data[0].y) == list(range(0, 48, 3))
    assert "3 pages per row" in fig.layout.title.text
    full = page_maps(db, run_id, max_snapshots=10).owners
    assert (matrix.owners == dominant_owners(full, 3)).all()


def test_kernel_figures(db, synthetic_db):
    _, run_id, run = synthetic_db
    stats = kernel_stats(db, run_id)
    seconds: dict[str, float] = {}
    for e in run.events:
        if isinstance(e, KernelTiming):
            seconds[e.name] = seconds.get(e.name, 0.0) + e.seconds
    time_fig = figures.kernel_time_figure(stats)
    assert dict(zip(time_fig.data[0].y, time_fig.data[0].x, strict=True)) == pytest.approx(seconds)
    peaks = queries.device_peaks(run_info(db, run_id))
    roof = figures.roofline_figure(stats, peaks)
    for s in stats:
        point = _trace(roof, s.name)
        # The synthetic kernels do 2e6 FLOP and move 1e5 bytes per token.
        assert point.x[0] == pytest.approx(20.0) and point.y[0] == pytest.approx(s.tflops)
    line = next(t for t in roof.data if t.name.startswith("roof"))
    assert max(line.y) == pytest.approx(peaks.tflops)
    no_roof = figures.roofline_figure(stats, queries.DevicePeaks(None, None, "unknown device"))
    assert "device peaks unknown: no roof drawn" in _annotations(no_roof)


def test_eviction_figures(db, synthetic_db):
    _, run_id, run = synthetic_db
    counts = queries.event_counts(db, run_id)
    fig = figures.event_counts_figure(counts)
    assert sum(_trace(fig, "offloaded").y) == run.truth.offloaded_pages
    assert sum(_trace(fig, "preempted").y) == run.truth.preemptions
    costs = queries.transfer_costs(db, run_info(db, run_id))
    cost_fig = figures.transfer_cost_figure(costs)
    measured = dict(
        zip(_trace(cost_fig, "measured").x, _trace(cost_fig, "measured").y, strict=True)
    )
    assert measured["reload"] == pytest.approx(3e-5 * 1e3)
    assert cost_fig.layout.yaxis.type == "log"


def test_gpu_figure_and_its_absence(db, synthetic_db):
    _, run_id, run = synthetic_db
    points = gpu_series(db, run_id, 20)
    fig = figures.gpu_figure(points)
    assert list(_trace(fig, "GPU 0 power").y) == [p.power_w for p in points]
    assert _trace(fig, "GPU 0 memory total").y[0] == pytest.approx(80.0)  # GiB
    assert "no GPU in this run" in _annotations(figures.gpu_figure([]))


def test_request_figure(db, synthetic_db):
    _, run_id, run = synthetic_db
    rid = next(e.request_id for e in run.events if isinstance(e, RequestPreempted))
    trace = queries.request_trace(db, run_id, rid)
    fig = figures.request_figure(trace)
    assert list(_trace(fig, "pages held").y) == trace.pages
    assert list(_trace(fig, "tokens held").y) == trace.tokens
    assert "preempted" in _annotations(fig)
    assert "choose a request in the table" in _annotations(figures.request_figure(None))


def test_compare_figures_and_table(db, synthetic_db, tmp_path):
    _, run_id, _ = synthetic_db
    comparison = compare_runs(db, [run_id, run_id])
    rows = figures.summary_table(["#a", "#b"], comparison.summaries)
    by_metric = {r["metric"]: r for r in rows}
    summary = comparison.summaries[0]
    assert by_metric["evicted pages"]["#a"] == f"{summary.evicted_pages:,}"
    assert by_metric["prefix hit rate"]["#b"] == f"{100 * summary.prefix_hit_rate:.1f}%"
    points = step_series(db, run_id, 20)
    fig = figures.compare_figure({"#a": points, "#b": []}, "hit_rate", "Hit rate", "%")
    assert [t.name for t in fig.data] == ["#a", "#b"]
    assert list(fig.data[0].y) == [None if p.hit_rate is None else 100 * p.hit_rate for p in points]


def test_empty_run_figures_say_why():
    assert "no steps recorded yet" in _annotations(figures.throughput_figure([]))
    assert "no kernel timings recorded" in _annotations(figures.kernel_time_figure([]))
    empty = queries.EventCounts([], 0.0, {})
    assert _annotations(figures.event_counts_figure(empty))
    assert "choose runs to compare" in _annotations(figures.compare_figure({}, "hit_rate", "", ""))


def test_a_sequential_replay_says_its_speed_was_not_measured(db, synthetic_db):
    """A sequential replay runs one request at a time and no model: its "output
    tokens/s" (251,861) and "TTFT p50 0.0 ms" had read as a server's."""
    _, run_id, run = synthetic_db
    summary = run_summary(db, run_id)
    replayed = {t.label: t for t in figures.summary_tiles(summary, {"timing": "sequential"})}
    measured = {t.label: t for t in figures.summary_tiles(summary, {"timing": "roofline"})}
    for label in ("output tokens/s", "TTFT p50", "TPOT p50"):
        assert (replayed[label].value, replayed[label].detail) == ("—", figures.NOT_MEASURED)
        assert measured[label].value != "—"
    assert replayed["evictions"] == measured["evictions"]  # what the cache did still shows
    assert replayed["evictions"].value == str(run.truth.evicted_pages)
