"""Plotly figures from query results: pure functions, no database, no Dash.

The dashboard and the HTML report draw with the same builders, and the tests
check that the numbers in a figure are the numbers the queries returned.
Missing data (a run that has not stepped yet, a CPU run without kernel peaks)
draws an empty figure that says why, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvscope.db.events import EventCounts
from kvscope.db.kernels import DevicePeaks, TransferCost
from kvscope.db.memory_budget import MeasuredBudget, budget_terms
from kvscope.db.page_replay import PageStateMatrix
from kvscope.db.page_states import STATE_PRIVATE, STATE_SHARED, STATES
from kvscope.db.queries import GpuPoint, KernelStat, PageMatrix, RunSummary, StepPoint
from kvscope.db.requests import RequestTrace
from kvscope.db.series import CachedSources
from kvscope.engine.events import (
    PAGE_CACHED,
    PAGE_EVICTED,
    PAGE_FREE,
    PageEvicted,
    PageOffloaded,
    PageReloaded,
    RequestPreempted,
    RequestResumed,
)

FONT = "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"
TIME_AXIS = "time since start (s)"

# Every table of the dashboard (DataTable keyword arguments).
TABLE_STYLE = {
    "style_table": {"overflowX": "auto"},
    "style_cell": {
        "fontFamily": FONT,
        "fontSize": "13px",
        "padding": "6px 10px",
        "textAlign": "left",
        "border": "none",
        "borderBottom": "1px solid #e2e8f0",
    },
    "style_header": {
        "fontWeight": "600",
        "backgroundColor": "#f8fafc",
        "color": "#475569",
        "borderBottom": "2px solid #cbd5e1",
    },
    "style_cell_conditional": [{"if": {"column_type": "numeric"}, "textAlign": "right"}],
}

# One colour per quantity, the same on every page.
COLORS = {
    "prefill": "#f59e0b",
    "decode": "#2563eb",
    "running": "#0d9488",
    "waiting": "#e11d48",
    "page_usage": "#7c3aed",
    "token_usage": "#059669",
    "fragmentation": "#f97316",
    "hit_rate": "#0891b2",
    "device": "#2563eb",
    "host": "#f59e0b",
    "cached": "#60a5fa",
    PageEvicted.kind: "#dc2626",
    PageOffloaded.kind: "#f59e0b",
    PageReloaded.kind: "#2563eb",
    RequestPreempted.kind: "#7c3aed",
    RequestResumed.kind: "#94a3b8",
    "measured": "#2563eb",
    "predicted": "#cbd5e1",
    "tflops": "#7c3aed",
    "gbps": "#0d9488",
    "pages": "#7c3aed",
    "tokens": "#059669",
}
RUN_COLORS = ("#2563eb", "#f59e0b", "#059669", "#dc2626", "#7c3aed", "#0891b2")

# Page-map states, in the heatmap's colour order; requests cycle through the greens
# so neighbouring requests stay distinguishable.
PAGE_STATES = (("free", "#f1f5f9"), ("evicted", "#ef4444"), ("cached", "#60a5fa"))
REQUEST_SHADES = ("#059669", "#34d399", "#047857", "#6ee7b7", "#10b981", "#065f46")

EVENT_LABELS = {
    PageEvicted.kind: "evicted",
    PageOffloaded.kind: "offloaded",
    PageReloaded.kind: "reloaded",
    RequestPreempted.kind: "preempted",
    RequestResumed.kind: "resumed",
}


def _style(
    fig: go.Figure, title: str, y_title: str = "", x_title: str = TIME_AXIS, height: int = 320
) -> go.Figure:
    """The look every figure shares (subplot figures too)."""
    fig.update_layout(
        template="plotly_white",
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        font={"family": FONT, "size": 12, "color": "#1e293b"},
        height=height,
        margin={"l": 64, "r": 20, "t": 56, "b": 44},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
        hovermode="x unified",
        xaxis_title=x_title,
        yaxis_title=y_title,
    )
    # Explicit, so a refresh that patches an empty figure with data shows the axes.
    fig.update_xaxes(visible=True)
    fig.update_yaxes(visible=True)
    return fig


def _figure(
    title: str, y_title: str = "", x_title: str = TIME_AXIS, height: int = 320
) -> go.Figure:
    return _style(go.Figure(), title, y_title, x_title, height)


def _empty(fig: go.Figure, message: str) -> go.Figure:
    fig.update_layout(hovermode=False)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(
        text=message,
        showarrow=False,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        font={"size": 13, "color": "#64748b"},
    )
    return fig


def _scaled(values: Sequence[float | None], factor: float) -> list[float | None]:
    return [None if v is None else v * factor for v in values]


def _log_axis(values: Sequence[float]) -> dict:
    """A log axis in whole decades around ``values`` (one value still gets a range)."""
    lo, hi = np.log10(min(values)), np.log10(max(values))
    return {"type": "log", "dtick": 1, "range": [np.floor(lo - 0.3), np.ceil(hi + 0.3)]}


def _pct(values: Sequence[float | None]) -> list[float | None]:
    return _scaled(values, 100)


def _lines(
    title: str, y_title: str, x: Sequence[float], series: Mapping[str, Sequence], empty: str
) -> go.Figure:
    """A time-series figure, one line per named series (COLORS by the same key)."""
    fig = _figure(title, y_title)
    if not x:
        return _empty(fig, empty)
    for key, ys in series.items():
        fig.add_trace(
            go.Scatter(
                x=list(x),
                y=list(ys),
                name=key.replace("_", " "),
                mode="lines",
                line={"color": COLORS.get(key), "width": 2},
                connectgaps=False,
            )
        )
    return fig


# --- overview ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tile:
    label: str
    value: str
    detail: str = ""


def _ms(seconds: float | None) -> str:
    """Milliseconds, or seconds past 1 s (6.84 s, not 6,843.1 ms), as the TUI and reports do."""
    if seconds is None:
        return "—"
    return f"{seconds:,.2f} s" if seconds >= 1 else f"{seconds * 1e3:,.1f} ms"


def _percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{100 * fraction:.1f}%"


NOT_MEASURED = "not measured: sequential replay"


def summary_tiles(summary: RunSummary, config: dict | None = None) -> list[Tile]:
    """The overview's headline figures, formatted (a dash where there is no data). A
    sequential replay (``config``'s timing) runs one request at a time with no model:
    its speed and latencies are the replay's own wall time, not a server's, and say so."""
    s = summary
    timed = (config or {}).get("timing") != "sequential"
    rate = "—" if s.tokens_per_s is None or not timed else f"{s.tokens_per_s:,.1f}"
    speed = [
        Tile("output tokens/s", rate, f"{s.output_tokens:,} tokens in {s.elapsed_s:,.2f} s"),
        Tile("TTFT p50", _ms(s.ttft_p50_s), f"p99 {_ms(s.ttft_p99_s)}"),
        Tile("TPOT p50", _ms(s.tpot_p50_s), "per output token"),
    ]
    if not timed:
        speed = [Tile(t.label, "—", NOT_MEASURED) for t in speed]
    return [
        *speed,
        Tile(
            "prefix hit rate",
            _percent(s.prefix_hit_rate),
            f"{s.prefix_hit_tokens:,} of {s.prefix_queried_tokens:,} tokens",
        ),
        Tile(
            "peak page usage",
            _percent(s.peak_page_usage),
            f"mean token usage {_percent(s.mean_token_usage)}",
        ),
        Tile(
            "evictions",
            f"{s.evicted_pages:,}",
            f"{s.offloaded_pages:,} offloaded, {s.reloaded_pages:,} reloaded",
        ),
        Tile("preemptions", f"{s.preemptions:,}", f"{s.steps:,} steps"),
        Tile(
            "requests",
            f"{s.requests_finished:,} / {s.requests:,}",
            f"finished; {s.requests_rejected:,} rejected",
        ),
    ]


def _size(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def budget_tiles(budget: MeasuredBudget, config: dict | None = None) -> list[Tile]:
    """The measured memory budget's terms, then calc's KV prediction for the same device
    (only when ``--memory-fraction`` sized the KV cache: ``config`` is the run's)."""
    terms = budget_terms(budget, config or {})
    tiles = [Tile(term, _size(n), how) for term, n, how in terms]
    ratio = budget.kv_vs_prediction
    if ratio is not None and len(terms) == len(budget.terms()):
        tiles[-1] = Tile(tiles[-1].label, tiles[-1].value, f"measured / predicted {ratio:.2g}")
    return tiles


def throughput_figure(points: Sequence[StepPoint]) -> go.Figure:
    """Wall-clock prefill and decode tokens per second, per time bucket."""
    return _lines(
        "Throughput",
        "tokens/s",
        [p.t_s for p in points],
        {
            "prefill": [p.prefill_tokens_per_s for p in points],
            "decode": [p.decode_tokens_per_s for p in points],
        },
        "no steps recorded yet",
    )


def queue_figure(points: Sequence[StepPoint]) -> go.Figure:
    return _lines(
        "Scheduler queues",
        "requests (mean per bucket)",
        [p.t_s for p in points],
        {"running": [p.running for p in points], "waiting": [p.waiting for p in points]},
        "no steps recorded yet",
    )


# --- KV cache ------------------------------------------------------------------------------


def usage_figure(points: Sequence[StepPoint]) -> go.Figure:
    """Page-level usage beside token-level usage: the gap is internal fragmentation."""
    fig = _lines(
        "Page-level vs token-level usage",
        "%",
        [p.t_s for p in points],
        {
            "page_usage": _pct([p.page_usage for p in points]),
            "token_usage": _pct([p.token_usage for p in points]),
        },
        "no steps recorded yet",
    )
    if points:
        fig.update_yaxes(range=[0, 105])
    return fig


def fragmentation_figure(points: Sequence[StepPoint]) -> go.Figure:
    """Reserved token slots that hold no token (the unused tail of last pages)."""
    fig = _lines(
        "Internal fragmentation",
        "empty token slots",
        [p.t_s for p in points],
        {"fragmentation": [p.fragmentation_slots for p in points]},
        "no steps recorded yet",
    )
    fig.update_traces(fill="tozeroy")
    return fig


def page_state_codes(owners: np.ndarray) -> np.ndarray:
    """Heatmap colour index per cell: PAGE_STATES' order, then request shades."""
    codes = np.select(
        [owners == PAGE_FREE, owners == PAGE_EVICTED, owners == PAGE_CACHED], [0, 1, 2], 0
    )
    shades = len(PAGE_STATES) + owners % len(REQUEST_SHADES)
    return np.where(owners >= 0, shades, codes).astype(np.int8)  # int8: compact in JSON


def page_heatmap(matrix: PageMatrix) -> go.Figure:
    """Pages x snapshots, coloured by state; hover names the owning request."""
    fig = _figure("Page occupancy", "page", "step", height=460)
    if not matrix.steps:
        return _empty(fig, "no page-map snapshots recorded yet")
    owners = matrix.owners
    colors = [c for _, c in PAGE_STATES] + list(REQUEST_SHADES)
    k = len(colors)
    scale = [pair for i, c in enumerate(colors) for pair in ((i / k, c), ((i + 1) / k, c))]
    codes = page_state_codes(owners)
    # Hover names the owner: a request id, else the state (ints keep the JSON small).
    names = np.array([name for name, _ in PAGE_STATES], dtype=object)
    owner = np.where(owners >= 0, owners.astype(object), names[np.minimum(codes, 2)])
    fig.add_trace(
        go.Heatmap(
            z=codes,
            x=matrix.steps,
            y=(np.arange(owners.shape[0]) * matrix.page_stride).tolist(),
            customdata=owner,
            colorscale=scale,
            zmin=-0.5,
            zmax=k - 0.5,
            showscale=False,
            hovertemplate="step %{x}<br>page %{y}<br>owner: %{customdata}<extra></extra>",
        )
    )
    keys = (*PAGE_STATES, ("in use (shade per request)", REQUEST_SHADES[0]))
    return _page_grid_layout(fig, keys, "Page occupancy", matrix.page_stride)


def _page_grid_layout(
    fig: go.Figure, keys: Sequence[tuple[str, str]], title: str, page_stride: int
) -> go.Figure:
    """A page heatmap's colour keys (square legend markers) and axes; the title says
    how many pages a row holds when it holds several."""
    for name, color in keys:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=name,
                marker={"symbol": "square", "size": 12, "color": color},
            )
        )
    fig.update_layout(hovermode="closest", plot_bgcolor="#f1f5f9")
    fig.update_yaxes(autorange="reversed", showgrid=False)
    fig.update_xaxes(showgrid=False)
    if page_stride > 1:
        fig.update_layout(
            title_text=f"{title} ({page_stride} pages per row, shown as most of them are)"
        )
    return fig


# Colours of db/page_states.py's states; shared pages in ambers by holder count
# (2, 3-4, 5-8, 9+), private pages in their request's green shade.
STATE_COLORS = {
    "free": "#f1f5f9",
    "cached": "#60a5fa",
    "offloaded": "#a855f7",
    "evicted": "#ef4444",
}
SHARED_SHADES = ("#fcd34d", "#f59e0b", "#d97706", "#92400e")


def _fade(color: str) -> str:
    """``color`` pushed 75% towards white: cells the selected request does not hold."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * 0.75):02x}" for c in (r, g, b))


def page_state_heatmap(matrix: PageStateMatrix, request_id: int | None = None) -> go.Figure:
    """Pages x steps in db/page_states.py's states, every step exact; hover gives the
    state, its holders and (with several pages per row) the row's mix; with
    ``request_id`` (``matrix.selected``) every page it holds stands out, shared ones too."""
    title = "Page states" if request_id is None else f"Pages of request {request_id}"
    fig = _figure(title, "page", "step", height=460)
    if not matrix.steps:
        return _empty(fig, "no steps recorded yet")
    colors = [*STATE_COLORS.values(), *SHARED_SHADES, *REQUEST_SHADES]
    k = len(colors)
    state, holders = matrix.state, matrix.holders
    shade = np.select([holders <= 2, holders <= 4, holders <= 8], [0, 1, 2], 3)
    codes = np.where(state < STATE_PRIVATE, state, 0)
    codes = np.where(state == STATE_SHARED, 4 + shade, codes)
    codes = np.where(state == STATE_PRIVATE, 8 + matrix.holder % len(REQUEST_SHADES), codes)
    if matrix.selected is not None:
        codes = np.where(matrix.selected, codes, codes + k)
        colors = colors + [_fade(c) for c in colors]
    n = len(colors)
    scale = [pair for i, c in enumerate(colors) for pair in ((i / n, c), ((i + 1) / n, c))]
    names = np.array(STATES, dtype=object)[state]
    held = np.where(
        state == STATE_SHARED,
        "shared by " + holders.astype(str) + " (request " + matrix.holder.astype(str) + "…)",
        np.where(state == STATE_PRIVATE, "request " + matrix.holder.astype(str), names),
    )
    if matrix.page_stride > 1:
        mix = matrix.mix
        text = np.full(state.shape, "<br>pages:", dtype=object)
        for i, name in enumerate(STATES):
            text = text + np.where(mix[..., i] > 0, f" {name} " + mix[..., i].astype(str), "")
        held = held.astype(object) + text
    fig.add_trace(
        go.Heatmap(
            z=codes.astype(np.int8),
            x=matrix.steps,
            y=(np.arange(state.shape[0]) * matrix.page_stride).tolist(),
            customdata=held,
            colorscale=scale,
            zmin=-0.5,
            zmax=n - 0.5,
            showscale=False,
            hovertemplate="step %{x}<br>page %{y}<br>%{customdata}<extra></extra>",
        )
    )
    keys = (
        *STATE_COLORS.items(),
        ("shared (darker: more holders)", SHARED_SHADES[2]),
        ("private (shade per request)", REQUEST_SHADES[0]),
    )
    return _page_grid_layout(fig, keys, title, matrix.page_stride)


# --- prefix cache ---------------------------------------------------------------------------


def hit_rate_figure(points: Sequence[StepPoint]) -> go.Figure:
    """Hit tokens / queried tokens per bucket (gaps where nothing was looked up),
    and the same ratio of the counters summed since the start."""
    hits = np.cumsum([p.prefix_hit_tokens for p in points])
    queried = np.cumsum([p.prefix_queried_tokens for p in points])
    fig = _lines(
        "Prefix-cache hit rate",
        "%",
        [p.t_s for p in points],
        {
            "hit_rate": _pct([p.hit_rate for p in points]),
            "since_start": [100 * h / q if q else None for h, q in zip(hits, queried, strict=True)],
        },
        "no steps recorded yet",
    )
    fig.update_traces(selector={"name": "hit rate"}, mode="lines+markers", marker={"size": 4})
    fig.update_traces(selector={"name": "since start"}, line={"dash": "dash", "color": "#334155"})
    if points:
        fig.update_yaxes(range=[0, 105])
    return fig


def cached_sources_figure(sources: CachedSources) -> go.Figure:
    """Tokens served from cache instead of prefill, by the tier that held them."""
    fig = _figure("Cached tokens by source", "tokens")
    if not sources.t_s:
        return _empty(fig, "no steps recorded yet")
    for key, name, ys in (
        ("device", "prefix hits on device", sources.device_tokens),
        ("host", "reloaded from host tier", sources.host_tokens),
    ):
        fig.add_trace(go.Bar(x=sources.t_s, y=ys, name=name, marker_color=COLORS[key]))
    fig.update_layout(barmode="stack", bargap=0.05)
    return fig


def prefix_size_figure(points: Sequence[StepPoint]) -> go.Figure:
    """Pages only the prefix cache holds (unreferenced, evictable: db/page_states.py's
    "cached", a subset of the tree's pages), and the host tier's."""
    return _lines(
        "Prefix-cache size",
        "pages (mean per bucket)",
        [p.t_s for p in points],
        {
            "cached (unreferenced)": [p.pages_cached for p in points],
            "host": [p.host_pages_used for p in points],
        },
        "no steps recorded yet",
    ).update_traces(selector={"name": "host"}, name="host tier")


# --- eviction and offload ----------------------------------------------------------------------


def event_counts_figure(counts: EventCounts) -> go.Figure:
    """Evictions, offloads, reloads and preemptions per time bucket, stacked."""
    fig = _figure("Evict / offload / reload / preempt timeline", "events per bucket")
    if not counts.counts:
        return _empty(fig, "no evictions, offloads, reloads or preemptions in this run")
    for kind, ys in counts.counts.items():
        fig.add_trace(
            go.Bar(
                x=counts.t_s,
                y=ys,
                name=EVENT_LABELS.get(kind, kind),
                marker_color=COLORS.get(kind),
                width=counts.bucket_s * 0.9,
            )
        )
    fig.update_layout(barmode="stack")
    return fig


def transfer_cost_figure(costs: Sequence[TransferCost]) -> go.Figure:
    """Seconds per page, measured beside predicted, on a log axis (they span decades)."""
    fig = _figure("Cost model vs measured", "ms per page (log)", "")
    if not any(c.measured_s or c.predicted_s for c in costs):
        return _empty(fig, "no offloads, reloads or prefill steps to measure")
    actions = [c.action for c in costs]
    for key, values in (
        ("predicted", [c.predicted_s for c in costs]),
        ("measured", [c.measured_s for c in costs]),
    ):
        ms = [None if v is None else v * 1e3 for v in values]
        fig.add_trace(
            go.Bar(
                x=actions,
                y=ms,
                name=key,
                marker_color=COLORS[key],
                text=["" if v is None else f"{v:.3g} ms" for v in ms],
                textposition="outside",
            )
        )
    fig.update_layout(barmode="group", hovermode="closest")
    fig.update_yaxes(
        _log_axis([v * 1e3 for c in costs for v in (c.measured_s, c.predicted_s) if v])
    )
    if not any(c.predicted_s for c in costs):
        fig.add_annotation(
            text="no prediction: the run's config lacks a device preset, "
            "kv_bytes_per_token or params",
            showarrow=False,
            x=0.01,
            y=0.99,
            xref="paper",
            yref="paper",
            xanchor="left",
            yanchor="top",
            font={"size": 11, "color": "#64748b"},
        )
    return fig


# --- kernels -------------------------------------------------------------------------------------


def kernel_time_figure(stats: Sequence[KernelStat]) -> go.Figure:
    """Total seconds per kernel, most first."""
    fig = _figure("Time per kernel", "", "total seconds")
    if not stats:
        return _empty(fig, "no kernel timings recorded")
    fig.add_trace(
        go.Bar(
            y=[s.name for s in stats],
            x=[s.total_s for s in stats],
            orientation="h",
            marker_color=COLORS["decode"],
            text=[f"{s.calls:,} calls, mean {_ms(s.mean_s)}" for s in stats],
            textposition="auto",
        )
    )
    fig.update_layout(hovermode="closest")
    fig.update_yaxes(autorange="reversed")
    return fig


def kernel_throughput_figure(stats: Sequence[KernelStat]) -> go.Figure:
    """Achieved TFLOP/s and GB/s per kernel, side by side."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TFLOP/s", "GB/s"))
    _style(fig, "Achieved throughput", x_title="")
    fig.update_layout(showlegend=False, hovermode="closest")
    if not stats:
        return _empty(fig, "no kernel timings recorded")
    names = [s.name for s in stats]
    fig.add_trace(go.Bar(x=names, y=[s.tflops for s in stats], marker_color=COLORS["tflops"]), 1, 1)
    fig.add_trace(go.Bar(x=names, y=[s.gbps for s in stats], marker_color=COLORS["gbps"]), 1, 2)
    return fig


def roofline_figure(stats: Sequence[KernelStat], peaks: DevicePeaks) -> go.Figure:
    """Achieved TFLOP/s against arithmetic intensity, under the device's roofs."""
    fig = _figure(f"Roofline ({peaks.source})", "TFLOP/s (log)", "FLOP per byte (log)", 380)
    measured = [s for s in stats if s.tflops and s.gbps]
    if not measured:
        return _empty(fig, "no kernel timings with FLOP and byte counts")
    intensity = [s.tflops * 1e3 / s.gbps for s in measured]
    symbols = ("circle", "diamond", "square", "triangle-up", "x", "star")
    for i, (s, x) in enumerate(zip(measured, intensity, strict=True)):
        fig.add_trace(
            go.Scatter(
                x=[x],
                y=[s.tflops],
                mode="markers",
                name=s.name,
                marker={
                    "size": 13,
                    "symbol": symbols[i % len(symbols)],
                    "color": RUN_COLORS[i % len(RUN_COLORS)],
                    "line": {"width": 1, "color": "#ffffff"},
                },
                hovertemplate=f"{s.name}<br>%{{x:.3g}} FLOP/B<br>%{{y:.3g}} TFLOP/s<extra></extra>",
            )
        )
    xs_seen, ys_seen = list(intensity), [s.tflops for s in measured]
    if peaks.tflops and peaks.gbps:
        ridge = peaks.tflops * 1e3 / peaks.gbps
        xs = np.geomspace(min(min(intensity), ridge) / 10, max(max(intensity), ridge) * 10, 200)
        xs_seen.append(ridge)
        ys_seen.append(peaks.tflops)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=np.minimum(peaks.tflops, peaks.gbps * xs / 1e3),
                mode="lines",
                name=f"roof: {peaks.tflops:g} TFLOP/s, {peaks.gbps:g} GB/s",
                line={"color": "#334155", "dash": "dash"},
                hoverinfo="skip",
            )
        )
    else:
        fig.add_annotation(
            text="device peaks unknown: no roof drawn",
            showarrow=False,
            x=0.99,
            y=0.02,
            xref="paper",
            yref="paper",
            xanchor="right",
            font={"color": "#64748b"},
        )
    fig.update_layout(hovermode="closest")
    fig.update_xaxes(_log_axis(xs_seen))
    fig.update_yaxes(_log_axis(ys_seen))
    return fig


# --- GPU ---------------------------------------------------------------------------------------------


def gpu_figure(points: Sequence[GpuPoint]) -> go.Figure:
    """Utilisation, memory and power per device; says so when the run had no GPU."""
    if not points:
        return _empty(_figure("GPU samples", height=200), "no GPU in this run")
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("utilisation (%)", "memory (GiB)", "power (W)"),
    )
    _style(fig, "GPU samples", x_title="", height=620)
    fig.update_layout(xaxis3_title=TIME_AXIS)
    gib = 1 / 2**30
    for gpu in sorted({p.gpu_index for p in points}):
        mine = [p for p in points if p.gpu_index == gpu]
        t = [p.t_s for p in mine]
        color = RUN_COLORS[gpu % len(RUN_COLORS)]
        rows = (
            (1, "utilisation", [p.utilization_pct for p in mine], 1.0, "solid"),
            (2, "memory used", [p.memory_used_bytes for p in mine], gib, "solid"),
            (2, "torch allocated", [p.torch_allocated_bytes for p in mine], gib, "dot"),
            (2, "memory total", [p.memory_total_bytes for p in mine], gib, "dash"),
            (3, "power", [p.power_w for p in mine], 1.0, "solid"),
        )
        for row, name, values, factor, dash in rows:
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=_scaled(values, factor),
                    name=f"GPU {gpu} {name}",
                    mode="lines",
                    line={"color": color, "dash": dash},
                ),
                row,
                1,
            )
    return fig


# --- requests ----------------------------------------------------------------------------------------


def request_figure(trace: RequestTrace | None) -> go.Figure:
    """One request's pages (steps) and tokens over time, with its lifecycle marked."""
    if trace is None:
        return _empty(_figure("Request"), "choose a request in the table")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    _style(fig, f"Request {trace.request_id}: pages and tokens")
    fig.add_trace(
        go.Scatter(
            x=trace.pages_t_s,
            y=trace.pages,
            name="pages held",
            mode="lines",
            line={"shape": "hv", "color": COLORS["pages"], "width": 2},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=trace.tokens_t_s,
            y=trace.tokens,
            name="tokens held",
            connectgaps=False,
            mode="lines+markers",
            line={"color": COLORS["tokens"], "width": 2},
        ),
        secondary_y=True,
    )
    for t_s, kind in trace.marks:
        fig.add_vline(x=t_s, line={"color": "#cbd5e1", "width": 1, "dash": "dot"})
        fig.add_annotation(
            x=t_s,
            y=1,
            yref="paper",
            text=kind.removeprefix("request_").replace("_", " "),
            showarrow=False,
            textangle=-90,
            xanchor="right",
            yanchor="top",
            font={"size": 10, "color": "#64748b"},
        )
    fig.update_yaxes(title_text="pages", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(
        title_text="tokens", secondary_y=True, rangemode="tozero", showgrid=False, tickformat=",d"
    )
    return fig


# --- compare runs -----------------------------------------------------------------------------------


def compare_figure(
    series: Mapping[str, Sequence[StepPoint]], field: str, title: str, y_title: str
) -> go.Figure:
    """One line per run of one StepPoint field (fractions shown as %)."""
    fig = _figure(title, y_title)
    if not any(series.values()):
        return _empty(fig, "choose runs to compare")
    percent = field in ("page_usage", "token_usage", "hit_rate")
    for i, (label, points) in enumerate(series.items()):
        ys = [getattr(p, field) for p in points]
        fig.add_trace(
            go.Scatter(
                x=[p.t_s for p in points],
                y=_pct(ys) if percent else ys,
                name=label,
                mode="lines",
                line={"color": RUN_COLORS[i % len(RUN_COLORS)], "width": 2},
            )
        )
    return fig


SUMMARY_ROWS = (
    ("output tokens/s", "tokens_per_s", "{:,.1f}"),
    ("TTFT p50 (ms)", "ttft_p50_s", "ms"),
    ("TTFT p99 (ms)", "ttft_p99_s", "ms"),
    ("TPOT p50 (ms)", "tpot_p50_s", "ms"),
    ("prefix hit rate", "prefix_hit_rate", "%"),
    ("peak page usage", "peak_page_usage", "%"),
    ("mean token usage", "mean_token_usage", "%"),
    ("evicted pages", "evicted_pages", "{:,}"),
    ("offloaded pages", "offloaded_pages", "{:,}"),
    ("reloaded pages", "reloaded_pages", "{:,}"),
    ("preemptions", "preemptions", "{:,}"),
    ("requests finished", "requests_finished", "{:,}"),
    ("elapsed (s)", "elapsed_s", "{:,.2f}"),
)


def _format(value: float | int | None, fmt: str) -> str:
    if value is None:
        return "—"
    if fmt == "ms":
        return f"{value * 1e3:,.1f}"
    if fmt == "%":
        return f"{100 * value:.1f}%"
    return fmt.format(value)


def config_value(value: object) -> str:
    """A config value as the compare page shows it: floats to 4 significant digits
    (a measured 0.30000000000000004 reads 0.3), None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_table(labels: Sequence[str], summaries: Sequence[RunSummary]) -> list[dict[str, str]]:
    """Headline figures as rows, one column per run (the comparison table)."""
    return [
        {"metric": name}
        | {label: _format(getattr(s, key), fmt) for label, s in zip(labels, summaries, strict=True)}
        for name, key, fmt in SUMMARY_ROWS
    ]
