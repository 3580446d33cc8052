"""The dashboard's behaviour: live refresh, routing, and one callback per page.

Live refresh in two steps: every tick, ``version`` stores a small fingerprint
of the database (run list, the chosen run's event count, step and status) and
stores it only when it changed; pages listen to ``version`` alone, so an idle
or finished run costs one cheap query per tick and a live one redraws as rows
arrive. Every figure carries ``uirevision`` = the run, so a user's zoom and
hidden traces survive a redraw of the same run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from dash import ALL, Dash, Input, Output, Patch, State, ctx, html, no_update
from dash.exceptions import PreventUpdate

from kvscope.app.dashboard import (
    capacity_page,
    figures,
    infllm_figures,
    layout,
    long_context_page,
    sizing_page,
    table_filter,
    watch_page,
)
from kvscope.db import queries
from kvscope.db.infllm import retrievals
from kvscope.db.memory_budget import budget_title, measured_budget
from kvscope.db.page_replay import page_state_matrix
from kvscope.db.queries import (
    RunInfo,
    compare_runs,
    event_timeline,
    gpu_series,
    kernel_stats,
    list_runs,
    page_maps,
    requests_table,
    run_info,
    run_summary,
    step_series,
)
from kvscope.db.sweeps import list_sweeps, sweep
from kvscope.engine.errors import KvscopeError

# Time buckets per time-series figure, snapshots and page rows per heatmap: what
# a screen can show, whatever the size of the run.
MAX_POINTS = 400
MAX_SNAPSHOTS = 200
MAX_PAGE_ROWS = 192
COMPARE_POINTS = 300
LATEST_EVENTS = 200


def run_label(info: RunInfo) -> str:
    name = info.subject  # the model, or a simulation's allocator
    model = f" · {name}" if name and name != info.kind else ""
    return f"#{info.run_id} {info.kind}{model} · {info.status}"


def _run(run_id: int | None) -> int:
    """The chosen run, or no update at all while the database has none."""
    if run_id is None:
        raise PreventUpdate
    return run_id


_AXIS = re.compile(r"[xy]axis\d*")


def _patch(fig: go.Figure) -> Patch:
    """``fig`` as a Patch of the shown figure that leaves alone what it does not set.

    Dash 4's dcc.Graph writes a user's zoom into its ``figure`` prop, so a whole
    new figure, even with the same ``uirevision``, would undo the zoom. Axes are
    patched setting by setting: a range the builder leaves to autorange stays as
    the user zoomed it; one the builder fixes is reset. Lists that come and go
    with the data (annotations, shapes) are always replaced.
    """
    figure = fig.to_plotly_json()
    layout = dict(figure["layout"])
    patch = Patch()
    patch["data"] = figure["data"]
    for key in ("annotations", "shapes"):
        patch["layout"][key] = layout.pop(key, [])
    for key, value in layout.items():
        if _AXIS.fullmatch(key):
            for name, setting in value.items():
                patch["layout"][key][name] = setting
        else:
            patch["layout"][key] = value
    return patch


def _live(fig: go.Figure, revision: object) -> go.Figure | Patch:
    """A whole figure when the page, run or selection changed; a patch that keeps
    the user's zoom when only new data arrived."""
    fig.update_layout(uirevision=str(revision))
    if set(ctx.triggered_prop_ids) == {"version.data"}:
        return _patch(fig)
    return fig


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _percent(fraction: float | None) -> float | None:
    """A share of the device's peak (db.kernels.device_peaks, as the roofline draws) in %."""
    return None if fraction is None else round(100 * fraction, 2)


def register(app: Dash, db_path: Path) -> None:
    """Attach every callback to ``app``; each opens its own read connection."""

    watch_renderer = watch_page.Renderer(db_path)  # one render at a time, none when unchanged

    @lru_cache(maxsize=16)
    def _read(query: Callable[..., Any], run_id: int, fingerprint: str, *args: Any) -> Any:
        """A query's result while the run is unchanged (``fingerprint``: the
        version store), shared by the pages: switching page, paging, filtering
        and sorting a big run do not query again. Results are never mutated."""
        with queries.reader(db_path) as db:
            return query(db, run_id, *args)

    def cached(query: Callable[..., Any], run_id: int, version: dict | None, *args: Any) -> Any:
        return _read(query, run_id, json.dumps(version, sort_keys=True), *args)

    def page_figure(run_id: int, version: dict | None, request_id: int | None) -> go.Figure:
        """Exact page states at every column (db/page_states.py), the request's pages
        lit; for a recording without page holds its snapshots. The KV-cache page and
        the requests page (nothing selected) share one cached matrix."""
        states = cached(
            page_state_matrix, run_id, version, MAX_SNAPSHOTS, MAX_PAGE_ROWS, None, None, request_id
        )
        if states is not None:
            return figures.page_state_heatmap(states, request_id)
        return figures.page_heatmap(
            cached(page_maps, run_id, version, MAX_SNAPSHOTS, MAX_PAGE_ROWS)
        )

    @app.callback(
        Output("run", "options"),
        Output("run", "value"),
        Input("tick", "n_intervals"),
        State("run", "options"),
        State("run", "value"),
    )
    def refresh_runs(_: int, options: list | None, chosen: int | None) -> tuple:
        with queries.reader(db_path) as db:
            runs = list_runs(db)
        fresh = [{"label": run_label(r), "value": r.run_id} for r in runs]
        if not any(r.run_id == chosen for r in runs):
            chosen_now = runs[0].run_id if runs else None
        else:
            chosen_now = chosen
        return (
            no_update if fresh == options else fresh,
            no_update if chosen_now == chosen else chosen_now,
        )

    @app.callback(
        Output("version", "data"),
        Input("tick", "n_intervals"),
        Input("run", "value"),
        State("version", "data"),
    )
    def refresh_version(_: int, run_id: int | None, old: dict | None) -> Any:
        with queries.reader(db_path) as db:
            new = queries.fingerprint(db, run_id)
        return no_update if new == old else new

    @app.callback(
        Output("run-status", "children"),
        Output("run-status", "className"),
        Input("version", "data"),
    )
    def status(version: dict | None) -> tuple[str, str]:
        if not version or version.get("run") is None:
            return "no runs yet", "badge"
        state = version.get("status", "unknown")
        return state, f"badge {state}"

    @app.callback(
        Output("page", "children"),
        *(Output(f"nav-{key}", "className") for key, _, _ in layout.PAGES),
        Input("url", "pathname"),
        Input("run", "value"),
    )
    def route(pathname: str | None, run_id: int | None) -> tuple:
        key = layout.PAGE_BY_PATH.get(pathname or "/")
        classes = ["nav-link active" if k == key else "nav-link" for k, _, _ in layout.PAGES]
        if key is None:
            return layout.message(f"No page at {pathname}."), *classes
        if run_id is not None and (key in layout.ENGINE_PAGES or key == watch_page.PAGE[0]):
            with queries.reader(db_path) as db:
                kind = run_info(db, run_id).kind
            if (kind == "watch") != (key == watch_page.PAGE[0]):
                return layout.not_applicable(key, run_id, kind), *classes
        elif ctx.triggered_id == "run":
            raise PreventUpdate  # a page that does not depend on the run stays as it is
        return layout.page(key), *classes

    @app.callback(
        Output("overview-budget", "children"),
        Input("run", "value"),
    )
    def memory_budget(run_id: int | None) -> Any:
        with queries.reader(db_path) as db:
            budget = measured_budget(db, _run(run_id))
            config = run_info(db, _run(run_id)).config if budget is not None else {}
        if budget is None:
            return None  # recorded before the engine measured its budget
        return html.Div(
            className="card",
            children=[
                html.H3(budget_title(budget, config)),
                html.Div(
                    className="tiles", children=layout.tiles(figures.budget_tiles(budget, config))
                ),
            ],
        )

    @app.callback(
        Output("watch-content", "children"),
        Input("version", "data"),
        Input("run", "value"),
        Input("watch-window", "value"),
        Input("watch-zoom", "data"),
    )
    def watch(
        _: dict | None, run_id: int | None, window: str | None = None, zoom: dict | None = None
    ) -> Any:
        return watch_renderer(_run(run_id), window, zoom)

    @app.callback(
        Output("watch-zoom", "data"),
        Input({"type": watch_page.ZOOM_GRAPH, "index": ALL}, "relayoutData"),
        Input("watch-window", "value"),
        prevent_initial_call=True,
    )
    def watch_zoom(_: list, __: str | None) -> Any:
        """A time graph zoomed: its range is the window; a window chosen: no zoom."""
        if ctx.triggered_id == "watch-window":
            return None
        return watch_page.zoom_of(ctx.triggered[0]["value"])

    @app.callback(
        Output("long-context-note", "children"),
        Output("long-context-request", "options"),
        Output("long-context-request", "value"),
        Output("long-context-heatmap", "figure"),
        Output("long-context-resident", "figure"),
        Input("version", "data"),
        Input("run", "value"),
        Input("long-context-request", "value"),
    )
    def long_context(version: dict | None, run_id: int | None, chosen: int | None) -> tuple:
        run_id = _run(run_id)
        shown = long_context_page.view(cached(retrievals, run_id, version), chosen)
        return (
            None if shown.note is None else layout.message(shown.note),
            [{"label": infllm_figures.request_label(r), "value": r} for r in shown.requests],
            shown.request_id,
            _live(shown.heatmap, (run_id, shown.request_id)),
            _live(shown.resident, run_id),
        )

    @app.callback(
        Output("capacity-sweep", "options"),
        Output("capacity-sweep", "value"),
        Output("capacity-compare", "options"),
        Output("capacity-curves", "figure"),
        Output("capacity-misses", "figure"),
        Input("version", "data"),
        Input("capacity-sweep", "value"),
        Input("capacity-compare", "value"),
        State("run", "value"),
    )
    def capacity(
        _: dict | None, primary: str | None, others: list | None, run_id: int | None
    ) -> tuple:
        with queries.reader(db_path) as db:
            sweeps = list_sweeps(db)
            if primary is None and run_id is not None:  # first visit: the chosen run's sweep
                primary = run_info(db, run_id).config.get("sweep_id")
            ids = capacity_page.chosen(sweeps, primary, others)
            shown = [s for s in (sweep(db, i, misses=n == 0) for n, i in enumerate(ids)) if s]
        options = capacity_page.sweep_options(sweeps)
        return (
            options,
            ids[0] if ids else None,
            [o for o in options if not ids or o["value"] != ids[0]],
            _live(capacity_page.capacity_figure(shown), tuple(ids)),
            _live(capacity_page.miss_split_figure(shown[0] if shown else None), tuple(ids[:1])),
        )

    @app.callback(
        Output("sizing-tiles", "children"),
        Output("sizing-cliff", "figure"),
        Input("sizing-model", "value"),
        Input("sizing-device", "value"),
        Input("sizing-kv_dtype", "value"),
        Input("sizing-resident", "value"),
    )
    def sizing(model: str, device: str, kv_dtype: str, resident: float | None) -> tuple:
        try:
            report = sizing_page.cliff(model, device, kv_dtype, resident)
        except KvscopeError as exc:
            fig = figures._empty(figures._figure("The throughput cliff"), str(exc))
            return layout.message(str(exc)), fig
        return (
            layout.tiles(sizing_page.cliff_tiles(report)),
            sizing_page.cliff_chart(report),
        )

    @app.callback(
        Output("overview-tiles", "children"),
        Output("overview-throughput", "figure"),
        Output("overview-queues", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def overview(version: dict | None, run_id: int | None) -> tuple:
        run_id = _run(run_id)
        summary = cached(run_summary, run_id, version)
        points = cached(step_series, run_id, version, MAX_POINTS)
        return (
            layout.tiles(figures.summary_tiles(summary)),
            _live(figures.throughput_figure(points), run_id),
            _live(figures.queue_figure(points), run_id),
        )

    @app.callback(
        Output("kv-cache-heatmap", "figure"),
        Output("kv-cache-usage", "figure"),
        Output("kv-cache-fragmentation", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def kv_cache(version: dict | None, run_id: int | None) -> tuple:
        run_id = _run(run_id)
        points = cached(step_series, run_id, version, MAX_POINTS)
        return (
            _live(page_figure(run_id, version, None), run_id),
            _live(figures.usage_figure(points), run_id),
            _live(figures.fragmentation_figure(points), run_id),
        )

    @app.callback(
        Output("prefix-cache-hit-rate", "figure"),
        Output("prefix-cache-sources", "figure"),
        Output("prefix-cache-size", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def prefix_cache(version: dict | None, run_id: int | None) -> tuple:
        run_id = _run(run_id)
        points = cached(step_series, run_id, version, MAX_POINTS)
        with queries.reader(db_path) as db:
            sources = queries.cached_sources(db, run_id, points)
        return (
            _live(figures.hit_rate_figure(points), run_id),
            _live(figures.cached_sources_figure(sources), run_id),
            _live(figures.prefix_size_figure(points), run_id),
        )

    @app.callback(
        Output("eviction-timeline", "figure"),
        Output("eviction-costs", "figure"),
        Output("eviction-events", "data"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def eviction(_: dict | None, run_id: int | None) -> tuple:
        run_id = _run(run_id)
        with queries.reader(db_path) as db:
            counts = queries.event_counts(db, run_id)
            costs = queries.transfer_costs(db, run_info(db, run_id))
            latest = event_timeline(db, run_id, limit=LATEST_EVENTS)
        rows = [
            {
                "t_s": round(e.t_s, 4),
                "step": e.step,
                "kind": figures.EVENT_LABELS.get(e.kind, e.kind),
                "request_id": e.request_id,
                "details": ", ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in e.payload.items()
                    if k != "request_id"
                ),
            }
            for e in reversed(latest)
        ]
        return (
            _live(figures.event_counts_figure(counts), run_id),
            _live(figures.transfer_cost_figure(costs), run_id),
            rows,
        )

    @app.callback(
        Output("kernels-time", "figure"),
        Output("kernels-throughput", "figure"),
        Output("kernels-roofline", "figure"),
        Output("kernels-table", "data"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def kernels(_: dict | None, run_id: int | None) -> tuple:
        run_id = _run(run_id)
        with queries.reader(db_path) as db:
            stats = kernel_stats(db, run_id)
            peaks = queries.device_peaks(run_info(db, run_id))
        rows = [
            {
                "name": s.name,
                "calls": s.calls,
                "total_s": round(s.total_s, 4),
                "mean_ms": round(s.mean_s * 1e3, 4),
                "tflops": _round(s.tflops, 4),
                "gbps": _round(s.gbps, 2),
                "peak_tflops_pct": _percent(s.peak_tflops_frac),
                "peak_gbps_pct": _percent(s.peak_gbps_frac),
            }
            for s in stats
        ]
        return (
            _live(figures.kernel_time_figure(stats), run_id),
            _live(figures.kernel_throughput_figure(stats), run_id),
            _live(figures.roofline_figure(stats, peaks), run_id),
            rows,
        )

    @app.callback(
        Output("gpu-note", "children"),
        Output("gpu-samples", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def gpu(_: dict | None, run_id: int | None) -> tuple:
        run_id = _run(run_id)
        with queries.reader(db_path) as db:
            points = gpu_series(db, run_id, MAX_POINTS)
        note = None if points else layout.message("No GPU in this run: nothing was sampled.")
        return note, _live(figures.gpu_figure(points), run_id)

    @app.callback(
        Output("requests-table", "data"),
        Output("requests-table", "page_count"),
        Input("version", "data"),
        Input("requests-table", "page_current"),
        Input("requests-table", "page_size"),
        Input("requests-table", "filter_query"),
        Input("requests-table", "sort_by"),
        Input("run", "value"),
    )
    def requests_page(
        version: dict | None, page: int, size: int, query: str, sort_by: list, run_id: int | None
    ) -> tuple:
        run_id = _run(run_id)
        rows = table_filter.filter_requests(cached(requests_table, run_id, version), query, sort_by)
        page = page or 0
        shown = [
            {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in table_filter.request_record(row).items()
            }
            for row in rows[page * size : (page + 1) * size]
        ]
        return shown, max(1, -(-len(rows) // size))

    @app.callback(
        Output("requests-detail", "figure"),
        Output("requests-pages", "figure"),
        Input("requests-table", "selected_row_ids"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def request_detail(selected: list | None, version: dict | None, run_id: int | None) -> Any:
        run_id = _run(run_id)
        request_id = int(selected[0]) if selected else None
        # Every page the selected request holds lights up, shared ones included.
        pages = page_figure(run_id, version, request_id)
        if request_id is None:
            return figures.request_figure(None), _live(pages, (run_id, None))
        try:
            with queries.reader(db_path) as db:
                trace = queries.request_trace(db, run_id, request_id)
        except KvscopeError:
            trace = None  # a row of another run, chosen before the run changed
        return (
            _live(figures.request_figure(trace), (run_id, selected[0])),
            _live(pages, (run_id, request_id)),
        )

    @app.callback(
        Output("compare-runs", "options"),
        Output("compare-runs", "value"),
        Input("version", "data"),
        State("compare-runs", "value"),
        State("run", "value"),
    )
    def compare_choices(version: dict | None, chosen: list | None, selected: int | None) -> tuple:
        with queries.reader(db_path) as db:
            runs = list_runs(db)
        options = [{"label": run_label(r), "value": r.run_id} for r in runs]
        if chosen:
            return options, no_update
        # Start from the run selected in the picker, beside the newest other run.
        first = selected if any(r.run_id == selected for r in runs) else None
        others = [r.run_id for r in runs if r.run_id != first]
        return options, ([first] if first is not None else []) + others[: 2 - (first is not None)]

    @app.callback(
        Output("compare-summary", "data"),
        Output("compare-summary", "columns"),
        Output("compare-config", "data"),
        Output("compare-config", "columns"),
        Output("compare-throughput", "figure"),
        Output("compare-hit-rate", "figure"),
        Output("compare-token-usage", "figure"),
        Output("compare-page-usage", "figure"),
        Input("compare-runs", "value"),
        Input("version", "data"),
    )
    def compare(chosen: list | None, _: dict | None) -> tuple:
        run_ids = list(dict.fromkeys(int(r) for r in chosen or []))
        with queries.reader(db_path) as db:
            comparison = compare_runs(db, run_ids)
            series = {f"#{r}": step_series(db, r, COMPARE_POINTS) for r in run_ids}
        labels = list(series)
        columns = [{"name": "", "id": "metric"}] + [{"name": c, "id": c} for c in labels]
        config_rows = [
            {"metric": key}
            | {label: figures.config_value(v) for label, v in zip(labels, values, strict=True)}
            for key, values in comparison.config_diff.items()
        ]
        revision = tuple(run_ids)
        return (
            figures.summary_table(labels, comparison.summaries),
            columns,
            config_rows,
            columns,
            _live(
                figures.compare_figure(
                    series, "decode_tokens_per_s", "Decode throughput", "tokens/s"
                ),
                revision,
            ),
            _live(figures.compare_figure(series, "hit_rate", "Prefix hit rate", "%"), revision),
            _live(
                figures.compare_figure(series, "token_usage", "Token-level usage", "%"), revision
            ),
            _live(figures.compare_figure(series, "page_usage", "Page-level usage", "%"), revision),
        )
