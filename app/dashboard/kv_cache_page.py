"""The KV cache page's callbacks: the page map over the run, usage and fragmentation."""

from __future__ import annotations

from dash import Dash, Input, Output

from kvscope.app.dashboard import figures
from kvscope.app.dashboard.live import MAX_POINTS, Reads, chosen_run, live
from kvscope.db.queries import (
    step_series,
)


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("kv-cache-heatmap", "figure"),
        Output("kv-cache-usage", "figure"),
        Output("kv-cache-fragmentation", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def kv_cache(version: dict | None, run_id: int | None) -> tuple:
        run_id = chosen_run(run_id)
        points = reads.cached(step_series, run_id, version, MAX_POINTS)
        return (
            live(reads.page_figure(run_id, version, None), run_id),
            live(figures.usage_figure(points), run_id),
            live(figures.fragmentation_figure(points), run_id),
        )
