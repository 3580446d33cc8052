"""The front ends show db/page_states.py's truth: a request's pages include its shared
ones (requests table, legend), selecting it lights all of them (TUI grid, dashboard
heatmap), and a shared page says how many requests hold it."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.app.dashboard.figures import page_state_heatmap
from kvscope.app.tui.data import RunReader
from kvscope.app.tui.legend import legend_text
from kvscope.app.tui.page_grid import PageGrid, plan_grid
from kvscope.db.page_replay import page_state_matrix
from kvscope.db.page_states import STATE_SHARED
from kvscope.engine.tiny import tiny_engine

from support.page_probe import record_probed, shared_prefix_arrivals


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory) -> tuple:
    path = tmp_path_factory.mktemp("views") / "r.db"
    run_id, probe, _ = record_probed(
        path, lambda bus: tiny_engine(64, bus=bus), shared_prefix_arrivals(10)
    )
    # the step with the most shared pages, and a request holding some of them
    step = max(probe.truth, key=lambda s: np.count_nonzero(probe.truth[s].state == STATE_SHARED))
    truth = probe.truth[step]
    rid = max(truth.request_pages, key=lambda r: truth.request_holdings(r).shared)
    return path, run_id, probe, step, rid


def _view_at(path, run_id, step):
    reader = RunReader(path)
    assert reader.ready()
    steps = reader.steps(run_id)
    view = reader.view(run_id, steps.t_s[steps.index_of_step(step)])
    reader.close()
    return view


def test_requests_count_their_shared_pages(shared_run) -> None:
    path, run_id, probe, step, rid = shared_run
    view = _view_at(path, run_id, step)
    truth = probe.truth[step]
    for r in view.requests:
        h = truth.request_holdings(r.request_id)
        assert (r.pages, r.private_pages, r.shared_pages, r.would_free) == (
            h.held,
            h.private,
            h.shared,
            h.would_free,
        ), r.request_id
    r = next(r for r in view.requests if r.request_id == rid)
    assert r.shared_pages > 0 and r.pages == r.private_pages + r.shared_pages
    legend = str(legend_text(view, 1, rid))
    assert f"request {rid} selected: {r.pages} pages ({r.private_pages} private, " in legend
    assert f"shared {truth.counts().shared}" in legend


def test_the_tui_grid_lights_every_page_of_the_selected_request(shared_run) -> None:
    path, run_id, probe, step, rid = shared_run
    view = _view_at(path, run_id, step)
    grid = PageGrid()
    grid.states, grid.owners = view.page_states, view.pages
    layout = plan_grid(len(view.pages), 60, 20)
    assert layout.per_cell == 1 and layout.glyph
    plain = grid._render_states(layout)
    # a shared cell shows its holder count
    most = int(view.page_states.holders.max())
    assert most >= 2 and str(most) in plain.plain
    grid.selected = rid
    lit = grid._render_states(layout)
    # faded cells differ from the unselected drawing; the request's own cells do not
    spans = {s.start: str(s.style) for s in plain.spans}
    lit_spans = {s.start: str(s.style) for s in lit.spans}
    changed = sum(spans[k] != lit_spans.get(k) for k in spans)
    held = len(view.page_states.request_pages[rid])
    assert changed >= 1 and len(spans) - changed - (layout.rows) >= held


def test_the_dashboard_heatmap_lights_every_page_of_the_selected_request(shared_run) -> None:
    path, run_id, probe, step, rid = shared_run
    matrix = page_state_matrix(path, run_id, max_steps=10_000, request_id=rid)
    assert matrix is not None and matrix.page_stride == 1
    j = matrix.steps.index(step)
    expected = np.zeros(matrix.state.shape[0], bool)
    expected[probe.truth[step].request_pages[rid]] = True
    assert np.array_equal(matrix.selected[:, j], expected)
    assert np.array_equal(matrix.state[:, j], probe.truth[step].state)
    fig = page_state_heatmap(matrix, rid)
    assert "shared by" in " ".join(map(str, np.asarray(fig.data[0].customdata).ravel()))


def test_one_set_of_figures_at_the_end_of_a_run(tmp_path) -> None:
    """The TUI at the last step, the run summary (dashboard overview, report, the
    end-of-run summary) and ``kvscope runs`` give the same figures."""
    import dataclasses

    from kvscope.db import formulas, queries
    from kvscope.db.events import CHURN_KINDS
    from kvscope.db.source import connection

    path = tmp_path / "r.db"
    run_id, probe, kinds = record_probed(
        path,
        lambda bus: tiny_engine(22, bus=bus, offload="always"),
        shared_prefix_arrivals(8, prefix_len=16, every=1, out=20),
    )
    assert kinds.get("page_evicted", 0) > 0 and kinds.get("request_preempted", 0) > 0
    summary = queries.run_summary(path, run_id)
    with connection(path) as conn:
        stored = dict(
            conn.execute("SELECT name, value FROM metrics WHERE run_id = ?", (run_id,)).fetchall()
        )
    figures = {
        name: value
        for name, value in dataclasses.asdict(summary).items()
        if isinstance(value, (int, float)) and name in stored
    }
    # the headline figures are among those compared (the loop below is not vacuous)
    assert {"output_tokens", "prefix_hit_rate", "evicted_pages", "preemptions"} <= figures.keys()
    for name, value in figures.items():
        assert stored[name] == pytest.approx(value), name  # what finish() stored
    view = _view_at(path, run_id, max(probe.truth))
    states = {r.state for r in view.requests}
    assert states == {"finished"}
    assert sum(r.output_tokens for r in view.requests) == summary.output_tokens
    assert len(view.requests) == summary.requests == queries.run_info(path, run_id).requests
    total = view.total
    assert formulas.hit_rate(total.prefix_hit_tokens, total.prefix_queried_tokens) == pytest.approx(
        summary.prefix_hit_rate
    )
    evicted, offloaded, _, preempted = CHURN_KINDS
    assert total.churn[evicted] == summary.evicted_pages
    assert total.churn[offloaded] == summary.offloaded_pages
    assert total.churn[preempted] == summary.preemptions
    c = view.page_states.counts()
    assert view.row.pages_cached == c.cached and view.tree_pages == c.tree >= c.cached


def test_the_dashboard_requests_table_splits_each_requests_pages(tmp_path) -> None:
    """Stopped while requests share the prefix, the dashboard's requests table (the rows
    its callback sends, and the report's) gives each request's pages held, private,
    shared and would-free: the engine's truth and the TUI's figures at that step; the
    TUI's running counters and the run summary give the same churn and hit rate."""
    from kvscope.app.dashboard.layout import REQUEST_COLUMNS
    from kvscope.app.dashboard.table_filter import request_record
    from kvscope.db import queries
    from kvscope.engine.events import EventBus
    from kvscope.engine.sampler import SamplingParams
    from kvscope.profiler.recorder import Recorder

    from support.page_probe import PageProbe

    path = tmp_path / "r.db"
    bus = EventBus()
    engine = tiny_engine(64, bus=bus)
    recorder = Recorder(path, {"test": True}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    probe = PageProbe(engine)
    arrivals = shared_prefix_arrivals(10, out=30)
    for step in range(12):  # every request arrived, none finished
        for _, prompt, n in [a for a in arrivals if a[0] == step]:
            engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
        engine.step()
        probe.read()
    recorder.finish("interrupted")
    run_id, last = recorder.run_id, max(probe.truth)
    truth = probe.truth[last]
    rows = [request_record(r) for r in queries.requests_table(path, run_id)]
    assert len(rows) == 10
    for row in rows:
        h = truth.request_holdings(row["request_id"])
        split = (row["pages"], row["private_pages"], row["shared_pages"], row["would_free"])
        assert split == (h.held, h.private, h.shared, h.would_free), row["request_id"]
    assert sum(row["shared_pages"] > 0 for row in rows) >= 2
    assert all(row["pages"] == row["private_pages"] + row["shared_pages"] for row in rows)
    view = _view_at(path, run_id, last)
    tui = {
        r.request_id: (r.pages, r.private_pages, r.shared_pages, r.would_free)
        for r in view.requests
    }
    assert tui == {
        row["request_id"]: (
            row["pages"],
            row["private_pages"],
            row["shared_pages"],
            row["would_free"],
        )
        for row in rows
    }
    shown = {key for _, key, _ in REQUEST_COLUMNS}
    assert {"pages", "private_pages", "shared_pages", "would_free"} <= shown
    summary = queries.run_summary(path, run_id)
    total = view.total
    assert (total.prefix_queried_tokens, total.prefix_hit_tokens) == (
        summary.prefix_queried_tokens,
        summary.prefix_hit_tokens,
    ) and summary.prefix_hit_tokens > 0
