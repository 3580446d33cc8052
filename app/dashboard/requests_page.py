"""The Requests page's callbacks: the filtered, sorted, paged table, and a chosen
request's timeline and pages."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output

from kvscope.app.dashboard import figures, table_filter
from kvscope.app.dashboard.live import Reads, chosen_run, live
from kvscope.db import queries
from kvscope.db.queries import (
    requests_table,
)
from kvscope.engine.errors import KvscopeError


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("requests-table", "data"),
        Output("requests-table", "page_count"),
        Input("version", "data"),
        Input("requests-table", "page_current"),
        Input("requests-table", "page_size"),
        Input("requests-table", "filter_query"),
        Input("requests-table", "sort_by"),
        Input("run", "value"),
    )
    def requests_page(
        version: dict | None, page: int, size: int, query: str, sort_by: list, run_id: int | None
    ) -> tuple:
        run_id = chosen_run(run_id)
        rows = table_filter.filter_requests(
            reads.cached(requests_table, run_id, version), query, sort_by
        )
        page = page or 0
        shown = [
            {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in table_filter.request_record(row).items()
            }
            for row in rows[page * size : (page + 1) * size]
        ]
        return shown, max(1, -(-len(rows) // size))

    @app.callback(
        Output("requests-detail", "figure"),
        Output("requests-pages", "figure"),
        Input("requests-table", "selected_row_ids"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def request_detail(selected: list | None, version: dict | None, run_id: int | None) -> Any:
        run_id = chosen_run(run_id)
        request_id = int(selected[0]) if selected else None
        # Every page the selected request holds lights up, shared ones included.
        pages = reads.page_figure(run_id, version, request_id)
        if request_id is None:
            return figures.request_figure(None), live(pages, (run_id, None))
        try:
            with reads.reader() as db:
                trace = queries.request_trace(db, run_id, request_id)
        except KvscopeError:
            trace = None  # a row of another run, chosen before the run changed
        return (
            live(figures.request_figure(trace), (run_id, selected[0])),
            live(pages, (run_id, request_id)),
        )
