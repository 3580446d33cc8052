"""What every dashboard callback shares: the database reads, cached while the chosen run
is unchanged, and live redraws that keep a user's zoom.

Live refresh in two steps: every tick, ``version`` stores a small fingerprint of
the database (run list, the chosen run's event count, step and status) and
stores it only when it changed; pages listen to ``version`` alone, so an idle or
finished run costs one cheap query per tick and a live one redraws as rows
arrive. Every figure carries ``uirevision`` = the run, so a user's zoom and
hidden traces survive a redraw of the same run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from dash import Patch, ctx
from dash.exceptions import PreventUpdate

from kvscope.app.dashboard import figures
from kvscope.db import queries
from kvscope.db.page_replay import page_state_matrix
from kvscope.db.queries import RunInfo, page_maps

# Time buckets per time-series figure, snapshots and page rows per heatmap: what
# a screen can show, whatever the size of the run.
MAX_POINTS = 400
MAX_SNAPSHOTS = 200
MAX_PAGE_ROWS = 192


class Reads:
    """The database the dashboard shows, read by every callback through here."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path

        @lru_cache(maxsize=16)
        def read(query: Callable[..., Any], run_id: int, fingerprint: str, *args: Any) -> Any:
            with queries.reader(db_path) as db:
                return query(db, run_id, *args)

        self._read = read

    def reader(self):
        """One read connection for one callback, closed afterwards."""
        return queries.reader(self.db_path)

    def cached(self, query: Callable[..., Any], run_id: int, version: dict | None,
               *args: Any) -> Any:  # fmt: skip
        """A query's result while the run is unchanged (``version``: the version store),
        shared by the pages: switching page, paging, filtering and sorting a big run do
        not query again. Results are never mutated."""
        return self._read(query, run_id, json.dumps(version, sort_keys=True), *args)

    def page_figure(self, run_id: int, version: dict | None, request_id: int | None) -> go.Figure:
        """Exact page states at every column (db/page_states.py), the request's pages
        lit; for a recording without page holds its snapshots. The KV-cache page and
        the requests page (nothing selected) share one cached matrix."""
        states = self.cached(
            page_state_matrix, run_id, version, MAX_SNAPSHOTS, MAX_PAGE_ROWS, None, None, request_id
        )
        if states is not None:
            return figures.page_state_heatmap(states, request_id)
        return figures.page_heatmap(
            self.cached(page_maps, run_id, version, MAX_SNAPSHOTS, MAX_PAGE_ROWS)
        )


def run_label(info: RunInfo) -> str:
    name = info.subject  # the model, or a simulation's allocator
    model = f" · {name}" if name and name != info.kind else ""
    return f"#{info.run_id} {info.kind}{model} · {info.status}"


def chosen_run(run_id: int | None) -> int:
    """The chosen run, or no update at all while the database has none."""
    if run_id is None:
        raise PreventUpdate
    return run_id


_AXIS = re.compile(r"[xy]axis\d*")


def _patch(fig: go.Figure) -> Patch:
    """``fig`` as a Patch of the shown figure that leaves alone what it does not set.

    Dash 4's dcc.Graph writes a user's zoom into its ``figure`` prop, so a whole
    new figure, even with the same ``uirevision``, would undo the zoom. Axes are
    patched setting by setting: a range the builder leaves to autorange stays as
    the user zoomed it; one the builder fixes is reset. Lists that come and go
    with the data (annotations, shapes) are always replaced.
    """
    figure = fig.to_plotly_json()
    layout = dict(figure["layout"])
    patch = Patch()
    patch["data"] = figure["data"]
    for key in ("annotations", "shapes"):
        patch["layout"][key] = layout.pop(key, [])
    for key, value in layout.items():
        if _AXIS.fullmatch(key):
            for name, setting in value.items():
                patch["layout"][key][name] = setting
        else:
            patch["layout"][key] = value
    return patch


def live(fig: go.Figure, revision: object) -> go.Figure | Patch:
    """A whole figure when the page, run or selection changed; a patch that keeps
    the user's zoom when only new data arrived."""
    fig.update_layout(uirevision=str(revision))
    if set(ctx.triggered_prop_ids) == {"version.data"}:
        return _patch(fig)
    return fig
