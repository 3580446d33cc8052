"""The GPU page's callbacks: the sampled utilisation, memory and power."""

from __future__ import annotations

from dash import Dash, Input, Output

from kvscope.app.dashboard import figures, parts
from kvscope.app.dashboard.live import MAX_POINTS, Reads, chosen_run, live
from kvscope.db.queries import (
    gpu_series,
)


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("gpu-note", "children"),
        Output("gpu-samples", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def gpu(_: dict | None, run_id: int | None) -> tuple:
        run_id = chosen_run(run_id)
        with reads.reader() as db:
            points = gpu_series(db, run_id, MAX_POINTS)
        note = None if points else parts.message("No GPU in this run: nothing was sampled.")
        return note, live(figures.gpu_figure(points), run_id)
