"""What the TUI shows at one position of one run, read from the database.

The TUI never holds engine state: a live run, an attached run and a replayed
run are the same database read at a different position, so there is one code
path. ``RunReader.view(run_id, t_s)`` turns a position into a ``View`` holding
every panel's figures; every figure comes from ``db`` (this module only picks
the windows the panels show).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvscope.db import queries
from kvscope.db.events import CHURN_KINDS, Counters, counters, events_per_bucket
from kvscope.db.formulas import KernelStat
from kvscope.db.infllm import Retrieval, has_retrievals, retrievals
from kvscope.db.memory_budget import MeasuredBudget, measured_budget
from kvscope.db.page_replay import owners_at, step_pages, tree_pages
from kvscope.db.page_states import StepPages
from kvscope.db.pages import PageSnapshot, page_map_at
from kvscope.db.requests import RequestState, requests_at
from kvscope.db.runs import RunInfo, newest_run, run_info
from kvscope.db.series import GpuPoint, StepPoint, StepRow, StepTimes, step_row, step_times
from kvscope.db.source import Position, run_origin
from kvscope.db.store import empty_file, open_db
from kvscope.engine.errors import KvscopeError

# Seconds of recent history behind the "window" figures (hit rate, rates, tokens/s).
WINDOW_S = 10.0
# Seconds of history the sparklines cover, and the points they are drawn from.
HISTORY_S = 120.0
HISTORY_POINTS = 48


@dataclass(frozen=True, slots=True)
class View:
    """Every figure the panels show, for one run at one position. A run that has
    not recorded a step yet has only ``run`` and empty ``steps``."""

    run: RunInfo
    steps: StepTimes
    index: int = 0  # position in ``steps``
    row: StepRow | None = None  # None until the run records its first step
    history: list[StepPoint] = field(default_factory=list)  # HISTORY_S in HISTORY_POINTS
    recent: StepPoint | None = None  # one bucket over the last WINDOW_S
    total: Counters = Counters(0.0)
    window: Counters = Counters(0.0)
    churn_history: dict[str, list[int]] = field(default_factory=dict)  # per history bucket
    tree_pages: int = 0
    page_map: PageSnapshot | None = None  # the snapshot ``pages`` was replayed from
    pages: np.ndarray | None = None  # owner per page at the position (PAGE_* codes)
    # Every page's state at the position (db/page_states.py); None for a recording
    # without page holds (a simulation, an older run: ``pages`` alone then).
    page_states: StepPages | None = None
    requests: list[RequestState] = field(default_factory=list)
    kernels: list[KernelStat] = field(default_factory=list)
    gpu: list[GpuPoint] = field(default_factory=list)
    budget: MeasuredBudget | None = None  # None: recorded before the engine measured it
    # InfLLM: None when the run has no retrievals; else those of the history window.
    retrievals: list[Retrieval] | None = None

    @property
    def t_s(self) -> float:
        return self.row.t_s if self.row else 0.0


def check_database(
    path: Path, run_id: int | None, *, missing_ok: bool = False, no_runs_ok: bool = False
) -> None:
    """Fail with one clear line before the UI starts when ``path`` cannot be shown.

    ``missing_ok``: a run is about to be recorded there, so the file and the run
    may not exist yet. ``no_runs_ok``: following, so the UI may wait for a
    writer's first run.
    """
    if not path.exists():
        if missing_ok:
            return
        raise KvscopeError(
            f"no database at {path} (record a run with `kvscope run`, or give a database path)"
        )
    if path.is_file() and path.stat().st_size == 0:
        if missing_ok:
            return
        raise empty_file(path)
    ids = sorted(run.run_id for run in queries.list_runs(path))
    if run_id is not None and run_id not in ids and not missing_ok:
        listed = ", ".join(map(str, ids)) if len(ids) <= 10 else f"{ids[0]} to {ids[-1]}"
        held = f"it holds runs {listed}" if ids else "it holds no runs"
        raise KvscopeError(f"no run {run_id} in {path} ({held})")
    if not ids and not no_runs_ok:
        raise KvscopeError(f"{path} holds no runs yet (record one with `kvscope run`)")


class RunReader:
    """The TUI's one handle on a database: used by one worker thread at a time.

    The file may not exist yet (a run about to be recorded): ``ready()`` says
    whether it can be read, and every other method needs it to be True.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        self._steps: dict[int, StepTimes] = {}

    def ready(self) -> bool:
        """Open the database if it exists and is not still being created."""
        if self._db is None and self.path.exists() and self.path.stat().st_size > 0:
            self._db = open_db(self.path, create=False).conn
        return self._db is not None

    @property
    def conn(self) -> sqlite3.Connection:
        assert self._db is not None, "RunReader.ready() first"
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def newest_run(self, after: int = 0) -> int | None:
        """The newest run's id if it is above ``after`` (a run started after a baseline)."""
        return newest_run(self.conn, after)

    def steps(self, run_id: int) -> StepTimes:
        """The run's steps so far; only steps recorded since the last call are read."""
        known = step_times(self.conn, run_id, self._steps.get(run_id, StepTimes()))
        self._steps[run_id] = known
        return known

    def view(self, run_id: int, t_s: float | None) -> View:
        """Every panel's figures at the last step at or before ``t_s`` (None: the newest)."""
        conn = self.conn
        run = run_info(conn, run_id)
        steps = self.steps(run_id)
        index = len(steps) - 1 if t_s is None else steps.index_at(t_s)
        row = step_row(conn, run_id, steps.steps[index]) if steps.steps else None
        if row is None:
            return View(run, steps)
        t = row.t_s
        at = Position(run_id, row.step, run_origin(conn, run_id) + round(t * 1e9))
        since = max(0.0, t - HISTORY_S)
        snapshot = page_map_at(conn, run_id, row.step)
        states = step_pages(conn, run_id, row.step)
        if states is not None:
            pages, tree_size = states.owners(), states.counts().tree
        else:  # an older recording: the snapshot replayed through owner codes
            tree = tree_pages(conn, at)
            pages = owners_at(conn, at, snapshot, tree) if snapshot else None
            tree_size = len(tree)
        recent = queries.step_series(conn, run_id, 1, max(0.0, t - WINDOW_S), t)
        history_lo = at.ts_ns - round(min(t, HISTORY_S) * 1e9)
        return View(
            run=run,
            steps=steps,
            index=index,
            row=row,
            history=queries.step_series(conn, run_id, HISTORY_POINTS, since, t),
            recent=recent[-1] if recent else None,
            total=counters(conn, at, t),
            window=counters(conn, at, min(WINDOW_S, t)),
            churn_history=events_per_bucket(
                conn, run_id, CHURN_KINDS, history_lo, at.ts_ns, HISTORY_POINTS, at.step
            ),
            tree_pages=tree_size,
            page_map=snapshot,
            pages=pages,
            page_states=states,
            requests=requests_at(conn, at, t, states if states is not None else pages),
            kernels=queries.kernel_stats(conn, run_id, until_s=t),
            gpu=queries.gpu_series(conn, run_id, HISTORY_POINTS, since, t),
            budget=measured_budget(conn, run_id),
            retrievals=(
                [
                    r
                    for r in retrievals(conn, run_id, window_ns=(history_lo, at.ts_ns))
                    if r.step <= at.step
                ]
                if has_retrievals(conn, run_id)
                else None
            ),
        )
