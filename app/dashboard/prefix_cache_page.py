"""The Prefix cache page's callbacks: hit rate, where cached tokens came from, the
tree's size."""

from __future__ import annotations

from dash import Dash, Input, Output

from kvscope.app.dashboard import figures
from kvscope.app.dashboard.live import MAX_POINTS, Reads, chosen_run, live
from kvscope.db import queries
from kvscope.db.queries import (
    step_series,
)


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("prefix-cache-hit-rate", "figure"),
        Output("prefix-cache-sources", "figure"),
        Output("prefix-cache-size", "figure"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def prefix_cache(version: dict | None, run_id: int | None) -> tuple:
        run_id = chosen_run(run_id)
        points = reads.cached(step_series, run_id, version, MAX_POINTS)
        with reads.reader() as db:
            sources = queries.cached_sources(db, run_id, points)
        return (
            live(figures.hit_rate_figure(points), run_id),
            live(figures.cached_sources_figure(sources), run_id),
            live(figures.prefix_size_figure(points), run_id),
        )
