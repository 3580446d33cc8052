"""The dashboard's Long context page: InfLLM retrievals of a run (issue 15).

For the chosen request, which distant blocks each step attended (block x
step heatmap), and every request's resident vs offloaded KV bytes; a run
without retrieval events says so. Figures are ``infllm_figures``' builders
over ``db.infllm.retrievals``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html

from kvscope.app.dashboard import infllm_figures, parts
from kvscope.app.dashboard.infllm_figures import block_heatmap, resident_bytes_figure
from kvscope.app.dashboard.live import Reads, chosen_run, live
from kvscope.db.infllm import Retrieval, retrievals

PAGE = ("long-context", "Long context", "/long-context")
NO_RETRIEVALS = "No InfLLM retrievals in this run (record one with --attention-mode infllm)."


@dataclass(frozen=True, slots=True)
class LongContextView:
    """What the page shows for one run and request choice."""

    note: str | None  # a message instead of figures
    requests: list[int]
    request_id: int | None
    heatmap: go.Figure
    resident: go.Figure


def view(rows: Sequence[Retrieval], chosen: int | None) -> LongContextView:
    """The heatmap of ``chosen`` (or of the request with the most retrieval
    steps when ``chosen`` has none) and every request's bytes."""
    requests = sorted({r.request_id for r in rows})
    if chosen not in requests:
        steps: dict[int, int] = {}
        for r in rows:
            steps[r.request_id] = steps.get(r.request_id, 0) + 1
        chosen = max(steps, key=lambda rid: (steps[rid], -rid)) if steps else None
    note = NO_RETRIEVALS if not rows else None
    return LongContextView(
        note,
        requests,
        chosen,
        block_heatmap(rows, -1 if chosen is None else chosen),
        resident_bytes_figure(rows),
    )


def layout() -> list:
    return [
        html.Div(id="long-context-note", className="wide"),
        html.Div(
            className="card wide",
            children=[
                html.H3("Request"),
                dcc.Dropdown(
                    id="long-context-request",
                    clearable=False,
                    searchable=False,
                    placeholder="a request with retrievals",
                ),
            ],
        ),
        *(
            html.Div(
                className="card wide",
                children=dcc.Graph(
                    id=graph_id,
                    figure={"data": [], "layout": {}},
                    config={"displaylogo": False, "responsive": True},
                    className="graph",
                ),
            )
            for graph_id in ("long-context-heatmap", "long-context-resident")
        ),
    ]


def register(app: Dash, reads: Reads) -> None:
    """This page's callbacks."""

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
        run_id = chosen_run(run_id)
        shown = view(reads.cached(retrievals, run_id, version), chosen)
        return (
            None if shown.note is None else parts.message(shown.note),
            [{"label": infllm_figures.request_label(r), "value": r} for r in shown.requests],
            shown.request_id,
            live(shown.heatmap, (run_id, shown.request_id)),
            live(shown.resident, run_id),
        )
