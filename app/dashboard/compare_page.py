"""The Compare runs page's callbacks: which runs, their summaries, configs and series
side by side."""

from __future__ import annotations

from dash import Dash, Input, Output, State, no_update

from kvscope.app.dashboard import figures
from kvscope.app.dashboard.live import Reads, live, run_label
from kvscope.db.queries import (
    compare_runs,
    list_runs,
    step_series,
)

COMPARE_POINTS = 300  # time buckets per run in each compared series


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("compare-runs", "options"),
        Output("compare-runs", "value"),
        Input("version", "data"),
        State("compare-runs", "value"),
        State("run", "value"),
    )
    def compare_choices(version: dict | None, chosen: list | None, selected: int | None) -> tuple:
        with reads.reader() as db:
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
        with reads.reader() as db:
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
            live(
                figures.compare_figure(
                    series, "decode_tokens_per_s", "Decode throughput", "tokens/s"
                ),
                revision,
            ),
            live(figures.compare_figure(series, "hit_rate", "Prefix hit rate", "%"), revision),
            live(figures.compare_figure(series, "token_usage", "Token-level usage", "%"), revision),
            live(figures.compare_figure(series, "page_usage", "Page-level usage", "%"), revision),
        )
