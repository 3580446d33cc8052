"""The Overview page's callbacks: the run's tiles, throughput and queues, and the
memory budget the engine measured."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, html

from kvscope.app.dashboard import figures, parts
from kvscope.app.dashboard.live import MAX_POINTS, Reads, chosen_run, live
from kvscope.db.memory_budget import budget_title, measured_budget
from kvscope.db.queries import (
    run_info,
    run_summary,
    step_series,
)


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("overview-budget", "children"),
        Input("run", "value"),
    )
    def memory_budget(run_id: int | None) -> Any:
        with reads.reader() as db:
            budget = measured_budget(db, chosen_run(run_id))
            config = run_info(db, chosen_run(run_id)).config if budget is not None else {}
        if budget is None:
            return None  # recorded before the engine measured its budget
        return html.Div(
            className="card",
            children=[
                html.H3(budget_title(budget, config)),
                html.Div(
                    className="tiles", children=parts.tiles(figures.budget_tiles(budget, config))
                ),
            ],
        )

    @app.callback(
        Output("overview-tiles", "children"),
        Output("overview-throughput", "figure"),
        Output("overview-queues", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def overview(version: dict | None, run_id: int | None) -> tuple:
        run_id = chosen_run(run_id)
        summary = reads.cached(run_summary, run_id, version)
        points = reads.cached(step_series, run_id, version, MAX_POINTS)
        config = reads.cached(run_info, run_id, version).config
        return (
            parts.tiles(figures.summary_tiles(summary, config)),
            live(figures.throughput_figure(points), run_id),
            live(figures.queue_figure(points), run_id),
        )
