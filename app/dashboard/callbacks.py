"""The dashboard's behaviour: the run picker, live refresh and routing here, and each
page's callbacks in that page's module (``register(app, reads)``).

Live refresh (``live.py``): every tick, ``version`` stores a small fingerprint of
the database and stores it only when it changed; pages listen to ``version``
alone, so an idle or finished run costs one cheap query per tick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dash import Dash, Input, Output, State, ctx, no_update
from dash.exceptions import PreventUpdate

from kvscope.app.dashboard import (
    capacity_page,
    compare_page,
    eviction_page,
    gpu_page,
    kernels_page,
    kv_cache_page,
    layout,
    long_context_page,
    overview_page,
    parts,
    prefix_cache_page,
    requests_page,
    sizing_page,
    watch_page,
)
from kvscope.app.dashboard.live import Reads, run_label
from kvscope.db import queries
from kvscope.db.queries import list_runs, run_info

PAGES = (
    overview_page,
    kv_cache_page,
    prefix_cache_page,
    eviction_page,
    kernels_page,
    gpu_page,
    requests_page,
    compare_page,
    watch_page,
    long_context_page,
    capacity_page,
    sizing_page,
)


def register(app: Dash, db_path: Path) -> None:
    """Attach every callback to ``app``; each opens its own read connection."""
    reads = Reads(db_path)
    for page in PAGES:
        page.register(app, reads)

    @app.callback(
        Output("run", "options"),
        Output("run", "value"),
        Input("tick", "n_intervals"),
        State("run", "options"),
        State("run", "value"),
    )
    def refresh_runs(_: int, options: list | None, chosen: int | None) -> tuple:
        with reads.reader() as db:
            runs = list_runs(db)
        fresh = [{"label": run_label(r), "value": r.run_id} for r in runs]
        if not any(r.run_id == chosen for r in runs):
            chosen_now = runs[0].run_id if runs else None
        else:
            chosen_now = chosen
        return (
            no_update if fresh == options else fresh,
            no_update if chosen_now == chosen else chosen_now,
        )

    @app.callback(
        Output("version", "data"),
        Input("tick", "n_intervals"),
        Input("run", "value"),
        State("version", "data"),
    )
    def refresh_version(_: int, run_id: int | None, old: dict | None) -> Any:
        with reads.reader() as db:
            new = queries.fingerprint(db, run_id)
        return no_update if new == old else new

    @app.callback(
        Output("run-status", "children"),
        Output("run-status", "className"),
        Input("version", "data"),
    )
    def status(version: dict | None) -> tuple[str, str]:
        if not version or version.get("run") is None:
            return "no runs yet", "badge"
        state = version.get("status", "unknown")
        return state, f"badge {state}"

    @app.callback(
        Output("page", "children"),
        *(Output(f"nav-{key}", "className") for key, _, _ in layout.PAGES),
        Input("url", "pathname"),
        Input("run", "value"),
    )
    def route(pathname: str | None, run_id: int | None) -> tuple:
        key = layout.PAGE_BY_PATH.get(pathname or "/")
        classes = ["nav-link active" if k == key else "nav-link" for k, _, _ in layout.PAGES]
        if key is None:
            return parts.message(f"No page at {pathname}."), *classes
        if run_id is not None and (key in layout.ENGINE_PAGES or key == watch_page.PAGE[0]):
            with reads.reader() as db:
                kind = run_info(db, run_id).kind
            if (kind == "watch") != (key == watch_page.PAGE[0]):
                return layout.not_applicable(key, run_id, kind), *classes
        elif ctx.triggered_id == "run":
            raise PreventUpdate  # a page that does not depend on the run stays as it is
        return layout.page(key), *classes
