"""The dashboard's Capacity page: hit rate against capacity for the runs of a replay sweep.

``kvscope replay --db`` records each point of a sweep as a run of kind
``replay`` (``db.sweeps`` groups them by ``sweep_id``). The page draws one curve
per eviction policy (and page size) with the unlimited-capacity ceiling, the
missed tokens of each point by reason (cold, capacity, granularity, last
token: more memory only saves the capacity share), and overlays other sweeps
to compare them (dashed). The figure builders are pure functions of
``db.sweeps.Sweep``; ``miss_reasons_figure`` also serves the HTML report.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html

from kvscope.app.dashboard.figures import _empty, _figure
from kvscope.app.dashboard.live import Reads, live
from kvscope.db.miss_reasons import REASONS, MissCounts
from kvscope.db.queries import run_info
from kvscope.db.sweeps import Sweep, SweepPoint, list_sweeps
from kvscope.db.sweeps import sweep as read_sweep

PAGE = ("capacity", "Capacity", "/capacity")
NO_SWEEPS = "No capacity sweep recorded yet: run kvscope replay TRACE --db FILE."
CAPACITY_AXIS = "cache capacity (tokens)"
# One colour per policy, one per miss reason, the same everywhere.
POLICY_COLORS = {
    "lru": "#2563eb",
    "lfu": "#059669",
    "fifo": "#f59e0b",
    "belady": "#7c3aed",
}
REASON_COLORS = {
    "cold": "#94a3b8",
    "capacity": "#dc2626",
    "granularity": "#f59e0b",
    "last_token": "#0891b2",
}


def _curves(sweep: Sweep) -> dict[tuple[str, int], list[SweepPoint]]:
    """The sweep's finite-capacity points per (policy, page size), by capacity."""
    out: dict[tuple[str, int], list[SweepPoint]] = {}
    for p in sweep.points:
        if p.capacity_tokens is not None and p.hit_rate is not None:
            out.setdefault((p.policy, p.page_size), []).append(p)
    return {k: sorted(v, key=lambda p: p.capacity_tokens) for k, v in sorted(out.items())}


def capacity_figure(sweeps: Sequence[Sweep]) -> go.Figure:
    """Hit rate against capacity: the first sweep solid, the others dashed, each with
    its unlimited ceiling as a dotted line."""
    fig = _figure("Prefix-cache hit rate against capacity", "prompt tokens hit (%)", CAPACITY_AXIS)
    if not sweeps or not any(_curves(s) for s in sweeps):
        return _empty(fig, NO_SWEEPS)
    many_sizes = len({p.page_size for s in sweeps for p in s.points}) > 1
    for i, sweep in enumerate(sweeps):
        dash = "solid" if i == 0 else "dash"
        tag = "" if len(sweeps) == 1 else f" · {sweep.sweep_id}"
        for (policy, ps), points in _curves(sweep).items():
            name = policy + (f" (page {ps})" if many_sizes else "") + tag
            fig.add_trace(
                go.Scatter(
                    x=[p.capacity_tokens for p in points],
                    y=[100 * p.hit_rate for p in points],
                    mode="lines+markers",
                    name=name,
                    line={"color": POLICY_COLORS.get(policy), "dash": dash, "width": 2},
                    customdata=[p.run_id for p in points],
                    hovertemplate="%{y:.1f}% at %{x:,} tokens (run %{customdata})",
                )
            )
        for ps in sorted({p.page_size for p in sweep.points}):
            ceiling = sweep.ceiling(ps)
            if ceiling is not None:
                label = "unlimited" + (f" (page {ps})" if many_sizes else "") + tag
                fig.add_hline(
                    y=100 * ceiling,
                    line={"dash": "dot", "color": "#475569", "width": 1},
                    annotation_text=f"{label}: {ceiling:.1%}",
                    annotation_position="top left",
                )
    fig.update_xaxes(type="log")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(hovermode="closest")
    return fig


def miss_split_figure(sweep: Sweep | None, policy: str | None = None) -> go.Figure:
    """Each capacity point's missed tokens by reason, as shares (one policy: the
    sweep's first unless ``policy``); the unlimited point last."""
    fig = _figure("Why missed tokens missed", "share of missed tokens (%)", CAPACITY_AXIS)
    points = [
        p for p in (sweep.points if sweep else ()) if p.misses is not None and p.misses.missed
    ]
    if policy is None and points:
        policy = next((p.policy for p in points if p.capacity_tokens is not None), None)
    points = [p for p in points if p.policy == policy or p.capacity_tokens is None]
    if not points:
        return _empty(fig, "No missed-token reasons recorded for this sweep.")
    points.sort(key=lambda p: (p.capacity_tokens is None, p.capacity_tokens or 0, p.page_size))
    labels = [
        ("unlimited" if p.capacity_tokens is None else f"{p.capacity_tokens:,}")
        + (f" / page {p.page_size}" if len({q.page_size for q in points}) > 1 else "")
        for p in points
    ]
    for name, label in REASONS:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[100 * p.misses.shares()[name] for p in points],
                name=label,
                marker_color=REASON_COLORS[name],
                customdata=[getattr(p.misses, name) for p in points],
                hovertemplate=f"{label}: %{{y:.1f}}% (%{{customdata:,}} tokens)",
            )
        )
    fig.update_layout(barmode="stack", hovermode="x unified")
    fig.update_xaxes(type="category", title=f"{CAPACITY_AXIS}, {policy}")
    return fig


def miss_reasons_figure(counts: MissCounts | None) -> go.Figure:
    """One run's missed prompt tokens by reason (the report and the Requests page)."""
    fig = _figure("Why prompt tokens missed the prefix cache", "", "missed tokens", height=220)
    if counts is None or not counts.missed:
        return _empty(fig, "No missed-token reasons recorded in this run.")
    shares = counts.shares()
    for name, label in REASONS:
        fig.add_trace(
            go.Bar(
                y=["missed"],
                x=[getattr(counts, name)],
                name=f"{label} {shares[name]:.0%}",
                orientation="h",
                marker_color=REASON_COLORS[name],
                hovertemplate=f"{label}: %{{x:,}} tokens",
            )
        )
    fig.update_layout(barmode="stack", hovermode="closest")
    return fig


def sweep_options(sweeps: Sequence[Sweep]) -> list[dict]:
    return [{"label": s.label, "value": s.sweep_id} for s in sweeps]


def chosen(sweeps: Sequence[Sweep], primary: str | None, others: Sequence[str] | None) -> list[str]:
    """The sweep ids to draw: the primary (default: the newest) first, then the others."""
    ids = [s.sweep_id for s in sweeps]
    if primary not in ids:
        primary = ids[0] if ids else None
    rest = [i for i in (others or ()) if i in ids and i != primary]
    return ([primary] if primary else []) + rest


def layout() -> list:
    def graph(graph_id: str) -> html.Div:
        return html.Div(
            className="card wide",
            children=dcc.Graph(
                id=graph_id,
                figure={"data": [], "layout": {}},
                config={"displaylogo": False, "responsive": True},
                className="graph",
            ),
        )

    return [
        html.Div(
            className="card wide",
            children=[
                html.H3("Sweep"),
                html.P(
                    "Runs of one kvscope replay --db sweep; pick others to compare (dashed).",
                    className="hint",
                ),
                dcc.Dropdown(id="capacity-sweep", clearable=False, placeholder="a sweep"),
                dcc.Dropdown(id="capacity-compare", multi=True, placeholder="compare with"),
            ],
        ),
        graph("capacity-curves"),
        graph("capacity-misses"),
    ]


__all__ = [
    "PAGE",
    "capacity_figure",
    "chosen",
    "layout",
    "miss_reasons_figure",
    "miss_split_figure",
    "sweep_options",
]


def register(app: Dash, reads: Reads) -> None:
    """This page's callbacks."""

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
        with reads.reader() as db:
            sweeps = list_sweeps(db)
            if primary is None and run_id is not None:  # first visit: the chosen run's sweep
                primary = run_info(db, run_id).config.get("sweep_id")
            ids = chosen(sweeps, primary, others)
            shown = [s for s in (read_sweep(db, i, misses=n == 0) for n, i in enumerate(ids)) if s]
        options = sweep_options(sweeps)
        return (
            options,
            ids[0] if ids else None,
            [o for o in options if not ids or o["value"] != ids[0]],
            live(capacity_figure(shown), tuple(ids)),
            live(miss_split_figure(shown[0] if shown else None), tuple(ids[:1])),
        )
