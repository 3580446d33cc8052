"""The dashboard page of a watched vLLM/SGLang deployment (run kind ``watch``).

Pure figure and table builders over ``db.watch_read`` results (unit-tested
without a browser), ``load`` to run the queries once per refresh (they read
the recorder's aggregates, so a refresh costs the same at any session
length), and ``layout`` to assemble the page. Registering it in the dashboard is one page
entry and one callback that calls a ``Renderer``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from dash import ALL, Dash, Input, Output, ctx, dash_table, dcc, html, no_update
from plotly.subplots import make_subplots

from kvscope.app.dashboard.figures import TABLE_STYLE
from kvscope.app.dashboard.live import Reads, chosen_run
from kvscope.db import watch_read as q
from kvscope.db.source import reader
from kvscope.db.watch_snapshot import WatchSnapshot, watch_snapshot

PAGE = ("watch", "Watched deployment", "/watch")
TIME_AXIS = "time since start (s)"
# A source's lines share its colour; the medium is the line's dash.
MEDIUM_DASH = {"GPU": "solid", "CPU": "dot", "CPU_PINNED": "dot", "STORAGE": "dash"}
WINDOW_NAMES = [name for name, _ in q.WINDOWS]
# What a window changes, and what it cannot: the series keep per-bucket stores,
# new (prefill) blocks, removals, recomputations, routing misses, both at once and
# live blocks, nothing else.
WINDOW_SCOPE = (
    "In the window: stored, prefill (new) blocks, removed, recomputed after eviction and "
    "routing misses (counts, tokens/s, shares of the window's prefill), the graphs over "
    "time, the /metrics graphs and the incidents. Now: cached blocks and copies, "
    "duplication across replicas. Whole session: re-announced, removed unknown, clears, "
    "lifetimes, the residency histograms and the prefix tree (not kept per time bucket)."
)
ZOOMED = "zoomed"  # the window's name when a graph's time axis was zoomed into
ZOOM_GRAPH = "watch-time-graph"  # the pattern id's type of the graphs over time


def _time_graph(name: str, figure: go.Figure) -> dcc.Graph:
    """A graph over time: zooming its time axis makes the zoomed range the window."""
    return dcc.Graph(id={"type": ZOOM_GRAPH, "index": name}, figure=figure)


def zoom_of(relayout: dict | None):
    """What a time graph's ``relayoutData`` means for the window: a zoomed range
    ({start_s, end_s}), None when zoomed out (autorange), ``no_update`` for
    anything else (a legend click, a pan of the y axis)."""
    relayout = relayout or {}
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        start, end = sorted(float(relayout[f"xaxis.range[{i}]"]) for i in (0, 1))
        return {"start_s": max(start, 0.0), "end_s": end}
    if relayout.get("xaxis.autorange"):
        return None
    return no_update


SOURCE_COLORS = ("#2563eb", "#f59e0b", "#0d9488", "#e11d48", "#7c3aed", "#64748b", "#db2777")


def _figure(title: str, y_title: str, height: int = 320) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title=title,
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        xaxis_title=TIME_AXIS,
        yaxis_title=y_title,
        uirevision="watch",  # a user's zoom survives a refresh
    )
    return fig


def _empty(fig: go.Figure, message: str) -> go.Figure:
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def cached_blocks_figure(
    points: Sequence[q.CachedPoint], labels: dict[int, str] | None = None
) -> go.Figure:
    """Cached blocks over time, one line per source and medium."""
    fig = _figure("Cached blocks by medium", "blocks")
    lines: dict[tuple[int, str | None], list[q.CachedPoint]] = {}
    for p in points:
        lines.setdefault((p.source, p.medium), []).append(p)
    if not lines:
        return _empty(fig, "no block events recorded yet")
    for (source, medium), pts in sorted(lines.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        name = f"{(labels or {}).get(source, source)} {medium or '?'}"
        fig.add_scatter(
            x=[p.t_s for p in pts],
            y=[p.blocks for p in pts],
            name=name,
            mode="lines",
            line={
                "shape": "hv",
                "color": SOURCE_COLORS[source % len(SOURCE_COLORS)],
                "dash": MEDIUM_DASH.get(medium or "", "dashdot"),
            },
        )
    return fig


def duplication_figure(points: Sequence[q.DuplicatePoint]) -> go.Figure:
    """Copies of blocks beyond the first across replicas: KV the fleet holds twice."""
    fig = _figure("Duplicated blocks across replicas", "extra copies")
    engines = sorted({p.engine for p in points})
    if not points:
        return _empty(fig, "no block events recorded yet")
    for engine in engines:
        pts = [p for p in points if p.engine == engine]
        fig.add_scatter(
            x=[p.t_s for p in pts],
            y=[p.extra_copies for p in pts],
            name=engine,
            mode="lines",
            line={"shape": "hv"},
        )
    return fig


def engine_metrics_figure(series: q.EngineSeries) -> go.Figure:
    """One /metrics source: usage, hit rate, running/waiting, mean TTFT/ITL."""
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            f"KV cache used (% of its {series.usage_level})",
            "prefix hit rate (%, from counters)",
            "requests",
            "mean latency (s)",
        ),
    )
    fig.update_layout(
        template="plotly_white",
        height=520,
        title=f"/metrics of source {series.source} ({series.engine})",
        uirevision="watch",
    )

    def line(points: Sequence[q.MetricPoint], name: str, row: int, col: int,
             scale: float = 1.0) -> None:  # fmt: skip
        fig.add_scatter(
            x=[p.t_s for p in points], y=[p.value * scale for p in points], name=name, row=row,
            col=col,
        )  # fmt: skip

    # Both are shares (vLLM's kv_cache_usage_perc is 0-1, despite its name): in percent.
    line(series.usage, "used", 1, 1, 100.0)
    line(series.hit_rate, "hit rate", 1, 2, 100.0)
    fig.update_yaxes(range=[0, 100], row=1, col=1)
    fig.update_yaxes(range=[0, 100], row=1, col=2)
    line(series.running, "running", 2, 1)
    line(series.waiting, "waiting", 2, 1)
    line(series.ttft_mean_s, "TTFT", 2, 2)
    line(series.itl_mean_s, "ITL", 2, 2)
    return fig


def source_rows(sources: Sequence[q.WatchSource]) -> list[dict]:
    """The sources table: what each stream delivered, and what it lost."""
    return [
        {
            "source": s.label,
            "kind": s.kind,
            "engine": s.engine,
            "block size": s.block_size,
            "batches": s.batches,
            "block events": s.block_events,
            "gaps": s.gaps,
            "replayed": s.recovered_batches,
            "lost": s.lost_batches,
            "restarts": s.restarts,
            "disconnects": s.disconnects,
            "bad messages": s.bad_messages,
            "fields": q.attrs_summary(s.attrs),
        }
        for s in sources
    ]


def block_rows(stats: Sequence[q.BlockStats], windowed: bool = False) -> list[dict]:
    """Per source: cached now, stores, removals, reuse, churn, clears and lifetimes;
    ``windowed``: the stats are ``block_stats`` of a window, and the headers say
    which columns are the window's and which the whole session's."""

    def seconds(value: float | None) -> str:
        return "—" if value is None else f"{value:,.2f}"

    win, ses = (" (window)", " (session)") if windowed else ("", "")
    return [
        {
            "source": s.source,
            "cached": ", ".join(f"{m}: {n}" for m, n in sorted(s.cached.items(), key=str)) or "0",
            "copies": ", ".join(f"{m}: {n}" for m, n in sorted(s.copies.items(), key=str)) or "0",
            "stored" + win: s.stored,
            "new (prefill)" + win: "—" if s.new_blocks is None else s.new_blocks,
            "removed" + win: s.removed,
            "reused (re-announced)" + ses: s.reannounced,
            "recomputed after eviction" + win: s.recomputed,
            "routing misses" + win: s.routing_misses,
            "removed unknown" + ses: s.removed_unknown,
            # past the fold's memory of removals: re-stores of these count as new prefill
            "removals forgotten" + ses: s.forgotten_removals,
            "by group": ", ".join(f"{k}: {n}" for k, n in sorted(s.by_group.items()))
            if len({k.split("/")[-1] for k in s.by_group}) > 1
            else "",
            "cleared" + ses: s.clears,
            "restarts" + ses: s.resets,
            "lifetime p50 s" + ses: seconds(s.lifetime_p50_s),
            "lifetime p90 s" + ses: seconds(s.lifetime_p90_s),
        }
        for s in stats
    ]


def prefix_rows(prefixes: Sequence[q.SharedPrefix]) -> list[dict]:
    """The largest shared prefixes."""
    return [
        {
            "engine": p.engine,
            "block": f"{p.block_hash & (2**64 - 1):016x}",
            "prefix blocks": p.depth_blocks,
            "prefix tokens": p.prefix_tokens,
            "branches": p.branches,
            "blocks under it": p.subtree_blocks,
            "sources": ", ".join(map(str, p.sources)),
        }
        for p in prefixes
    ]


def tree_line(tree: Sequence[q.TreeSummary]) -> str:
    return (
        "; ".join(
            f"{t.engine}: {t.nodes:,} blocks in the tree, {t.roots:,} roots, "
            f"{t.branch_points:,} branch points, deepest {t.max_depth:,} blocks"
            for t in tree
        )
        or "no blocks stored yet"
    )


def duplication_rows(dups: Sequence[q.Duplication]) -> list[dict]:
    return [
        {
            "engine": d.engine,
            "blocks on >= 2 replicas": d.duplicated_blocks,
            "extra copies": d.extra_copies,
            "extra tokens": d.extra_tokens,
            "peak extra copies": d.peak_extra_copies,
        }
        for d in dups
    ]


def incident_rows(incidents: Sequence[q.Incident], limit: int = 200) -> list[dict]:
    """The newest incidents first."""
    return [
        {
            "t (s)": round(i.t_s, 3),
            "source": i.source,
            "kind": i.kind,
            "seqs": q.seq_range(i.first_seq, i.last_seq),
            "recovered": i.recovered,
            "lost": i.lost,
            "detail": i.detail or "",
        }
        for i in list(reversed(incidents))[:limit]
    ]


def _tokens(blocks: int | None, tokens: int | None) -> str:
    if blocks is None:
        return "—"  # a window's prefill recorded before v8 (q.SHARES_UNKNOWN)
    return f"{blocks:,}" if tokens is None else f"{blocks:,} ({tokens:,} tokens)"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def miss_rows(misses: Sequence[q.Misses]) -> list[dict]:
    """Per source and fleet-wide: prefill paid, recomputation after eviction
    (more KV would have saved it) and routing misses (a KV-aware router would have)."""
    return [
        {
            "source": "fleet" if m.source is None else m.source,
            "engine": m.engine,
            "prefill blocks": _tokens(m.new_blocks, m.new_tokens),
            "recomputed after eviction": _tokens(m.recomputed, m.recomputed_tokens),
            "recomputed tokens/s": _rate(m.per_s(m.recomputed_tokens)),
            "recomputed share of prefill": _share(m.recomputed_share),
            "routing misses": _tokens(m.routing_misses, m.routing_miss_tokens),
            "routing-miss tokens/s": _rate(m.per_s(m.routing_miss_tokens)),
            "routing share of prefill": _share(m.routing_share),
            "both at once": "—" if m.both is None else m.both,
        }
        for m in misses
    ]


def misses_figure(points: Sequence[q.MissPoint]) -> go.Figure:
    """Fleet-wide prefill, recomputation after eviction and routing misses over time."""
    fig = _figure("Prefill paid, and what was a miss (fleet)", "blocks/s")
    if not points:
        return _empty(fig, "no block events recorded yet")
    for engine in sorted({p.engine for p in points}):
        pts = [p for p in points if p.engine == engine]
        x = [p.t_s for p in pts]
        fig.add_scatter(x=x, y=[p.stored_per_s for p in pts], name=f"{engine} stored", mode="lines")
        fig.add_scatter(
            x=x, y=[p.recomputed_per_s for p in pts], name=f"{engine} recomputed", mode="lines"
        )
        fig.add_scatter(
            x=x,
            y=[p.routing_misses_per_s for p in pts],
            name=f"{engine} routing misses",
            mode="lines",
        )
    return fig


def cache_sources_figure(sources: Sequence[q.CacheSources]) -> go.Figure:
    """vLLM's cached prompt tokens per second by where the KV came from."""
    fig = _figure("Cached prompt tokens by source (vLLM /metrics)", "tokens/s")
    if not sources:
        return _empty(fig, "no vllm:prompt_tokens_cached_by_source_total scraped")
    for cs in sources:
        for kind, points in cs.by_source_per_s.items():
            fig.add_scatter(
                x=[p.t_s for p in points], y=[p.value for p in points],
                name=f"{cs.source} {kind}", mode="lines",
            )  # fmt: skip
        if cs.external_hit_rate:
            last = cs.external_hit_rate[-1].value
            fig.add_annotation(
                text=f"source {cs.source}: external prefix cache hit rate {last:.1%} (latest)",
                showarrow=False, xref="paper", yref="paper", x=0, y=1.08, xanchor="left",
            )  # fmt: skip
    return fig


def pressure_figure(queue: Sequence[q.MetricPoint], lag: Sequence[q.MetricPoint]) -> go.Figure:
    """kvscope's own queue: batches waiting to be written, and how long the oldest waited."""
    fig = _figure("Recorder back-pressure", "batches queued")
    if not queue:
        return _empty(fig, "the recorder kept up: nothing ever waited")
    fig.add_scatter(
        x=[p.t_s for p in queue], y=[p.value for p in queue], name="queued", mode="lines"
    )
    fig.add_scatter(
        x=[p.t_s for p in lag], y=[p.value for p in lag], name="lag (s)", mode="lines", yaxis="y2"
    )
    fig.update_layout(yaxis2={"title": "lag (s)", "overlaying": "y", "side": "right"})
    return fig


VLLM_RESIDENCY_TITLE = "vLLM's residency histograms (/metrics, sampled: --kv-cache-metrics)"
HISTOGRAM_TITLES = {
    "lifetime": "lifetime (stored to removed)",
    "idle_before_evict": "idle before eviction",
    "reuse_gap": "reuse gap (re-announced)",
    "restore_gap": "removal to re-store (recomputed)",
}


def histograms_figure(
    hists: dict[str, list[q.HistogramBin]],
    title: str = "Block residency from the events (all blocks)",
) -> go.Figure:
    """kvscope's residency histograms from the events (every block, not a sample),
    or vLLM's sampled ones from /metrics (``--kv-cache-metrics``)."""
    fig = make_subplots(
        rows=1, cols=len(HISTOGRAM_TITLES), subplot_titles=list(HISTOGRAM_TITLES.values())
    )
    fig.update_layout(
        template="plotly_white",
        height=320,
        title=title,
        showlegend=False,
        uirevision="watch",
    )
    for col, name in enumerate(HISTOGRAM_TITLES, 1):
        bins = hists.get(name, [])
        fig.add_bar(
            x=[f"<{b.high_s:.3g}s" for b in bins], y=[b.count for b in bins], row=1, col=col
        )
    return fig


def misses_note(misses: Sequence[q.Misses]) -> str:
    """What the misses table of a window is over, and where its shares are unknown."""
    unknown = any(m.new_blocks is None for m in misses)
    return f"In the window{f': {q.SHARES_UNKNOWN}' if unknown else ''}:"


def _table(rows: list[dict], table_id: str) -> dash_table.DataTable:
    columns = [{"name": name, "id": name} for name in (rows[0] if rows else {})]
    return dash_table.DataTable(
        id=table_id, data=rows, columns=columns, page_size=20, **TABLE_STYLE
    )


def window_line(data: WatchSnapshot, name: str = "") -> str:
    """Which window the page shows, and which figures follow it."""
    if data.window is None:
        return "Window: whole session. Zoom a graph's time axis to make its range the window."
    back = " Double-click the graph to zoom out." if name == ZOOMED else ""
    return f"Window: {name or 'chosen'} ({q.window_label(data.window)}).{back} {WINDOW_SCOPE}"


def layout(data: WatchSnapshot, window_name: str = "") -> html.Div:
    """The page for one watch run (of the window named ``window_name``)."""
    labels = {s.source: s.label for s in data.sources}
    windowed = data.window is not None
    return html.Div(
        [
            html.P(window_line(data, window_name), id="watch-window-note"),
            html.H3("Sources"),
            _table(source_rows(data.sources), "watch-sources"),
            _time_graph("cached", cached_blocks_figure(data.cached_series, labels)),
            html.H3("Blocks per source"),
            _table(block_rows(data.stats, windowed), "watch-blocks"),
            html.H3("Misses: more KV cache, or a better router?"),
            *([html.P(misses_note(data.misses), id="watch-misses-note")] if windowed else []),
            _table(miss_rows(data.misses), "watch-misses"),
            _time_graph("misses", misses_figure(data.miss_series)),
            dcc.Graph(figure=histograms_figure(data.histograms)),
            *(
                [dcc.Graph(figure=histograms_figure(data.residency, VLLM_RESIDENCY_TITLE))]
                if data.residency
                else []
            ),
            _time_graph("cache-sources", cache_sources_figure(data.cache_sources)),
            html.H3("Duplicated KV across replicas"),
            _table(duplication_rows(data.duplication), "watch-duplication"),
            _time_graph("duplication", duplication_figure(data.duplicate_series)),
            html.H3("Largest shared prefixes"),
            html.P(tree_line(data.tree)),
            _table(prefix_rows(data.prefixes), "watch-prefixes"),
            *[dcc.Graph(figure=engine_metrics_figure(series)) for series in data.engines],
            _time_graph("pressure", pressure_figure(data.queue, data.lag)),
            html.H3("Incidents"),
            _table(incident_rows(data.incidents), "watch-incidents"),
        ],
        className="watch-page",
    )


def page_layout() -> list:
    """The page's frame: the window selector, the zoomed range of a graph over time
    (``zoom_of``), and the content their callback fills."""
    return [
        dcc.Store(id="watch-zoom"),
        html.Div(
            [
                html.Span("Window: "),
                dcc.RadioItems(
                    id="watch-window",
                    options=WINDOW_NAMES,
                    value=WINDOW_NAMES[0],
                    inline=True,
                    style={"display": "inline-block"},
                ),
            ],
            className="watch-window",
        ),
        html.Div(id="watch-content", className="wide"),
    ]


def render(
    source: q.Source, run_id: int, window_name: str | None = None, zoom: dict | None = None
) -> html.Div:
    """Query and lay out the page for a zoomed range (``zoom_of``) or else one of
    ``watch_read.WINDOWS`` (by name; None or an unknown name: the whole session)."""
    if zoom:
        window = q.Window(zoom["start_s"], zoom["end_s"])
        return layout(watch_snapshot(source, run_id, window), ZOOMED)
    name, window = q.named_window(source, run_id, window_name)
    return layout(watch_snapshot(source, run_id, window), name)


class Renderer:
    """What the dashboard's watch callback calls: at most one render at a time (a
    browser's overlapping refreshes wait for it and then share it), and none when
    nothing was written since the last one (``watch_read.version``) and the
    window is the same."""

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.db_path = db_path
        self.renders = 0
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._page: html.Div | None = None

    def __call__(
        self, run_id: int, window_name: str | None = None, zoom: dict | None = None
    ) -> html.Div:
        with self._lock, reader(self.db_path) as db:
            zoomed = zoom and (zoom["start_s"], zoom["end_s"])
            key = (run_id, window_name, zoomed, q.version(db, run_id))
            if key != self._key or self._page is None:
                self._page = render(db, run_id, window_name, zoom)
                self._key = key
                self.renders += 1
            return self._page


def register(app: Dash, reads: Reads) -> None:
    """This page's callbacks."""
    watch_renderer = Renderer(reads.db_path)  # one render at a time, none when unchanged

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
        return watch_renderer(chosen_run(run_id), window, zoom)

    @app.callback(
        Output("watch-zoom", "data"),
        Input({"type": ZOOM_GRAPH, "index": ALL}, "relayoutData"),
        Input("watch-window", "value"),
        prevent_initial_call=True,
    )
    def watch_zoom(_: list, __: str | None) -> Any:
        """A time graph zoomed: its range is the window; a window chosen: no zoom."""
        if ctx.triggered_id == "watch-window":
            return None
        return zoom_of(ctx.triggered[0]["value"])
