"""The Eviction page's callbacks: event counts over time, transfer costs, the latest
events."""

from __future__ import annotations

from dash import Dash, Input, Output

from kvscope.app.dashboard import figures
from kvscope.app.dashboard.live import Reads, chosen_run, live
from kvscope.db import queries
from kvscope.db.queries import (
    event_timeline,
    run_info,
)

LATEST_EVENTS = 200  # rows of the latest-events table


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("eviction-timeline", "figure"),
        Output("eviction-costs", "figure"),
        Output("eviction-events", "data"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def eviction(_: dict | None, run_id: int | None) -> tuple:
        run_id = chosen_run(run_id)
        with reads.reader() as db:
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
            live(figures.event_counts_figure(counts), run_id),
            live(figures.transfer_cost_figure(costs), run_id),
            rows,
        )
