"""What the TUI shows at one position of one run, read from the database.

The TUI never holds engine state: a live run, an attached run and a replayed
run are the same database read at a different position, so there is one code
path. ``RunReader.view(run_id, t_s)`` turns a position into a ``View`` holding
every panel's figures. It reads through ``db.queries``; the few figures that
module has no query for (event counters up to a time, the prefix tree's size,
a request's state at a time) are computed here with small SQL queries.
"""

from __future__ import annotations

import bisect
import json
import os
import sqlite3
from collections import Counter
from dataclasses import dataclass, field, fields
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from db import queries
from db.formulas import KernelStat
from db.queries import GpuPoint, PageSnapshot, RunInfo, StepPoint
from db.schema import STEP_COLUMNS
from db.store import open_db
from engine.errors import KvscopeError
from engine.events import PAGE_CACHED, PAGE_EVICTED, PAGE_FREE

# Seconds of recent history behind the "window" figures (hit rate, rates, tokens/s).
WINDOW_S = 10.0
# Seconds of history the sparklines cover, and the points they are drawn from.
HISTORY_S = 120.0
HISTORY_POINTS = 48

# A page state the engine's snapshots do not have: evicted to the host tier
# (PAGE_EVICTED there, plus a PageEvicted event whose action was "offloaded").
PAGE_OFFLOADED = -4

# Event kinds counted by the eviction / offload / preemption panel, in display order.
CHURN_KINDS = ("page_evicted", "page_offloaded", "page_reloaded", "request_preempted")


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every recorded step of a run and its time, ascending: the replay's positions."""

    steps: tuple[int, ...] = ()
    t_s: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def end_s(self) -> float:
        return self.t_s[-1] if self.t_s else 0.0

    def index_at(self, t_s: float) -> int:
        """Index of the last step recorded at or before ``t_s`` (0 before the first)."""
        return max(0, bisect.bisect_right(self.t_s, t_s) - 1)


@dataclass(frozen=True, slots=True)
class StepRow:
    """One step summary as recorded (the panels' gauges at the position)."""

    t_s: float
    step: int
    batch_size: int
    prefill_tokens: int
    decode_tokens: int
    running: int
    waiting: int
    pages_total: int
    pages_used: int
    pages_cached: int
    pages_free: int
    page_size: int
    tokens_held: int
    host_pages_used: int
    duration_s: float


assert [f.name for f in fields(StepRow)][1:] == ["step", *STEP_COLUMNS[2:]]


@dataclass(frozen=True, slots=True)
class Counters:
    """Event counters over a span of the run (all of it up to the position, or a window)."""

    span_s: float
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    churn: dict[str, int] = field(default_factory=dict)  # CHURN_KINDS -> events


@dataclass(frozen=True, slots=True)
class RequestState:
    """One request as it stood at the position. Output tokens and TPOT are only
    recorded when a request finishes, so they are None before that."""

    request_id: int
    state: str  # waiting | running | preempted | finished | rejected
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    pages: int
    ttft_s: float | None
    tpot_s: float | None
    preemptions: int


@dataclass(frozen=True, slots=True)
class View:
    """Every figure the panels show, for one run at one position. A run that has
    not recorded a step yet has only ``run`` and an empty ``timeline``."""

    run: RunInfo
    timeline: Timeline
    index: int = 0  # position in the timeline
    row: StepRow | None = None  # None until the run records its first step
    history: list[StepPoint] = field(default_factory=list)  # HISTORY_S in HISTORY_POINTS
    recent: StepPoint | None = None  # one bucket over the last WINDOW_S
    total: Counters = Counters(0.0)
    window: Counters = Counters(0.0)
    churn_history: dict[str, list[int]] = field(default_factory=dict)  # per history bucket
    tree_pages: int = 0
    page_map: PageSnapshot | None = None  # the snapshot ``pages`` was replayed from
    pages: np.ndarray | None = None  # owner per page at the position (PAGE_* codes)
    requests: list[RequestState] = field(default_factory=list)
    kernels: list[KernelStat] = field(default_factory=list)
    gpu: list[GpuPoint] = field(default_factory=list)

    @property
    def t_s(self) -> float:
        return self.row.t_s if self.row else 0.0

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.timeline) - 1


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
        raise KvscopeError(f"{path} is empty: no run has been recorded into it")
    db = open_db(path, create=False)
    try:
        ids = sorted(run.run_id for run in queries.list_runs(db))
    finally:
        db.conn.close()
    if run_id is not None and run_id not in ids and not missing_ok:
        listed = ", ".join(map(str, ids)) if len(ids) <= 10 else f"{ids[0]} to {ids[-1]}"
        held = f"it holds runs {listed}" if ids else "it holds no runs"
        raise KvscopeError(f"no run {run_id} in {path} ({held})")
    if not ids and not no_runs_ok:
        raise KvscopeError(f"{path} holds no runs yet (record one with `kvscope run`)")


# Order of page events with equal timestamps (see RunReader's query notes).
_REPLAY_ORDER = """CASE kind WHEN 'pages_freed' THEN 0 WHEN 'block_removed' THEN 1
    WHEN 'page_evicted' THEN 2 WHEN 'all_blocks_cleared' THEN 3 WHEN 'block_stored' THEN 4
    ELSE 5 END"""


def _apply_page_events(
    owners: np.ndarray, events: list[tuple[str, int | None, dict]], tree: frozenset[int]
) -> None:
    """Apply page events that share one step and timestamp to ``owners``.

    Their order is unknown (the writer groups a batch by kind), so who holds a
    page comes from counting: a request holds a page it was given more often
    than it gave back. Pages nobody holds afterwards take the state their other
    events leave, applied releases first.
    """
    size = len(owners)
    holds: dict[int, Counter[int]] = {}
    for kind, rid, event in events:
        if kind in ("pages_allocated", "pages_freed") and rid is not None:
            for page in event["pages"]:
                if 0 <= page < size:
                    if page not in holds:
                        holds[page] = Counter({int(owners[page]): 1} if owners[page] >= 0 else {})
                    holds[page][rid] += 1 if kind == "pages_allocated" else -1
    for kind, _, event in events:
        pages = [p for p in event.get("pages", ()) if 0 <= p < size]
        if kind == "pages_freed":
            owners[pages] = [PAGE_CACHED if p in tree else PAGE_FREE for p in pages]
        elif kind == "block_stored":
            owners[[p for p in pages if owners[p] < 0]] = PAGE_CACHED
        elif kind == "block_removed":
            owners[[p for p in pages if owners[p] == PAGE_CACHED]] = PAGE_FREE
        elif kind == "page_evicted" and 0 <= event["page"] < size:
            offloaded = event.get("action") == "offloaded"
            owners[event["page"]] = PAGE_OFFLOADED if offloaded else PAGE_EVICTED
        elif kind == "all_blocks_cleared":
            owners[owners == PAGE_CACHED] = PAGE_FREE
    for page, counts in holds.items():
        holders = [rid for rid, n in counts.items() if n > 0]
        if holders:
            owners[page] = holders[-1]
        elif owners[page] >= 0:
            owners[page] = PAGE_CACHED if page in tree else PAGE_FREE


class _At(NamedTuple):
    """A position: the shown step and its step summary's timestamp."""

    run_id: int
    step: int
    ts_ns: int


class RunReader:
    """The TUI's one handle on a database: used by one worker thread at a time.

    The file may not exist yet (a run about to be recorded): ``ready()`` says
    whether it can be read, and every other method needs it to be True.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        self._timelines: dict[int, Timeline] = {}

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
        row = self.conn.execute("SELECT MAX(id) FROM runs").fetchone()
        return row[0] if row[0] is not None and row[0] > after else None

    def timeline(self, run_id: int) -> Timeline:
        """The run's steps so far; only steps recorded since the last call are read."""
        known = self._timelines.get(run_id, Timeline())
        start_ns = self._start_ns(run_id)
        rows = self.conn.execute(
            "SELECT step, ts_ns FROM steps WHERE run_id = ? AND step > ? ORDER BY step",
            (run_id, known.steps[-1] if known.steps else -1),
        ).fetchall()
        if rows:
            known = Timeline(
                known.steps + tuple(step for step, _ in rows),
                known.t_s + tuple((ts - start_ns) / 1e9 for _, ts in rows),
            )
            self._timelines[run_id] = known
        return known

    def _start_ns(self, run_id: int) -> int:
        row = self.conn.execute("SELECT start_ns FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KvscopeError(f"no run {run_id} in {self.path}")
        return row[0]

    def view(self, run_id: int, t_s: float | None) -> View:
        """Every panel's figures at the last step at or before ``t_s`` (None: the newest)."""
        conn = self.conn
        run = queries.run_info(conn, run_id)
        timeline = self.timeline(run_id)
        index = len(timeline) - 1 if t_s is None else timeline.index_at(t_s)
        row = self._step_row(run_id, timeline.steps[index]) if timeline.steps else None
        if row is None:
            return View(run, timeline)
        t = row.t_s
        at = _At(run_id, row.step, self._start_ns(run_id) + round(t * 1e9))
        since = max(0.0, t - HISTORY_S)
        snapshot = queries.page_map_at(conn, run_id, row.step)
        tree = self._tree(at)
        pages = self._pages_at(at, snapshot, tree) if snapshot else None
        recent = queries.step_series(conn, run_id, 1, max(0.0, t - WINDOW_S), t)
        return View(
            run=run,
            timeline=timeline,
            index=index,
            row=row,
            history=queries.step_series(conn, run_id, HISTORY_POINTS, since, t),
            recent=recent[-1] if recent else None,
            total=self._counters(at, t),
            window=self._counters(at, min(WINDOW_S, t)),
            churn_history=self._churn_history(at, min(t, HISTORY_S)),
            tree_pages=len(tree),
            page_map=snapshot,
            pages=pages,
            requests=self._requests(at, t, pages),
            kernels=queries.kernel_stats(conn, run_id, until_s=t),
            gpu=queries.gpu_series(conn, run_id, HISTORY_POINTS, since, t),
        )

    # --- queries db.queries has no equivalent for ------------------------------------
    # Events count as "by the position" when their step is at most the shown step:
    # an engine stamps every event with the step it belongs to, while timestamps
    # of consecutive steps can touch (the synthetic clock shares one per step).
    # Page events replay in step and time order; the writer inserts a batch grouped
    # by kind, so ids only order events of one kind, and events with equal
    # timestamps are applied as one change (see _apply_page_events).

    def _step_row(self, run_id: int, step: int) -> StepRow:
        columns = ", ".join(STEP_COLUMNS[2:])
        row = self.conn.execute(
            f"""SELECT (s.ts_ns - r.start_ns) / 1e9, s.step, {columns}
                FROM steps s JOIN runs r ON r.id = s.run_id WHERE s.run_id = ? AND s.step = ?""",
            (run_id, step),
        ).fetchone()
        return StepRow(*row)

    def _counters(self, at: _At, span_s: float) -> Counters:
        """Tokens computed, prefix-lookup tokens and churn events over the ``span_s``
        seconds up to the position."""
        args = {
            "run": at.run_id,
            "lo": at.ts_ns - round(span_s * 1e9),
            "hi": at.ts_ns,
            "step": at.step,
        }
        churn = dict(
            self.conn.execute(
                f"""SELECT kind, COUNT(*) FROM events WHERE run_id = :run
                    AND kind IN ({", ".join(f"'{k}'" for k in CHURN_KINDS)})
                    AND ts_ns > :lo AND ts_ns <= :hi AND step <= :step GROUP BY kind""",
                args,
            ).fetchall()
        )
        queried, hit = self.conn.execute(
            """SELECT SUM(json_extract(payload, '$.queried_tokens')),
                      SUM(json_extract(payload, '$.hit_tokens'))
               FROM events WHERE run_id = :run AND kind = 'prefix_lookup'
               AND ts_ns > :lo AND ts_ns <= :hi AND step <= :step""",
            args,
        ).fetchone()
        prefill, decode = self.conn.execute(
            """SELECT SUM(prefill_tokens), SUM(decode_tokens) FROM steps
               WHERE run_id = :run AND ts_ns > :lo AND ts_ns <= :hi""",
            args,
        ).fetchone()
        return Counters(
            span_s,
            prefill or 0,
            decode or 0,
            queried or 0,
            hit or 0,
            {k: churn.get(k, 0) for k in CHURN_KINDS},
        )

    def _churn_history(self, at: _At, span_s: float) -> dict[str, list[int]]:
        """Churn events per kind in HISTORY_POINTS equal buckets over the ``span_s``
        seconds up to the position."""
        lo_ns = at.ts_ns - round(span_s * 1e9)
        history = {kind: [0] * HISTORY_POINTS for kind in CHURN_KINDS}
        rows = self.conn.execute(
            f"""SELECT kind, MIN({HISTORY_POINTS - 1},
                       CAST((ts_ns - :lo) * {HISTORY_POINTS} / (:hi - :lo + 1) AS INTEGER)), COUNT(*)
                FROM events WHERE run_id = :run
                AND kind IN ({", ".join(f"'{k}'" for k in CHURN_KINDS)})
                AND ts_ns >= :lo AND ts_ns <= :hi AND step <= :step GROUP BY 1, 2""",
            {"run": at.run_id, "lo": lo_ns, "hi": at.ts_ns, "step": at.step},
        ).fetchall()
        for kind, bucket, n in rows:
            history[kind][max(bucket, 0)] += n
        return history

    def _tree(self, at: _At) -> frozenset[int]:
        """Pages in the prefix tree at the position: stored and not removed, evicted
        or cleared since. The latest block event per page decides (as a set, so an
        engine that reports an eviction as both BlockRemoved and PageEvicted is not
        counted twice)."""
        rows = self.conn.execute(
            f"""WITH cleared AS (
                 SELECT COALESCE(MAX(ts_ns), -1) AS ts FROM events
                 WHERE run_id = :run AND kind = 'all_blocks_cleared' AND step <= :step),
               changes AS (
                 SELECT e.id, e.step, e.ts_ns, e.kind, CAST(j.value AS INTEGER) AS page
                 FROM events e, json_each(e.payload, '$.pages') j
                 WHERE e.run_id = :run AND e.kind IN ('block_stored', 'block_removed')
                 AND e.ts_ns <= :hi AND e.step <= :step AND e.ts_ns > (SELECT ts FROM cleared)
                 UNION ALL
                 SELECT id, step, ts_ns, kind, json_extract(payload, '$.page') FROM events
                 WHERE run_id = :run AND kind = 'page_evicted'
                 AND ts_ns <= :hi AND step <= :step AND ts_ns > (SELECT ts FROM cleared))
               SELECT page FROM (
                 SELECT page, kind, ROW_NUMBER() OVER (
                   PARTITION BY page ORDER BY step DESC, ts_ns DESC, {_REPLAY_ORDER} DESC, id DESC) AS n
                 FROM changes)
               WHERE n = 1 AND kind = 'block_stored'""",
            {"run": at.run_id, "hi": at.ts_ns, "step": at.step},
        ).fetchall()
        return frozenset(page for (page,) in rows)

    def _pages_at(self, at: _At, snapshot: PageSnapshot, tree: frozenset[int]) -> np.ndarray:
        """Page owners at the position: the snapshot at or before it, brought forward
        through the page events of the steps since (snapshots come every few steps;
        the events make every step exact). Evicted pages that went to the host tier
        read PAGE_OFFLOADED."""
        owners = snapshot.owners.copy()
        if snapshot.pages_evicted:
            previous = self.conn.execute(
                "SELECT MAX(step) FROM page_maps WHERE run_id = ? AND step < ?",
                (at.run_id, snapshot.step),
            ).fetchone()[0]
            offloaded = [
                page
                for (page,) in self.conn.execute(
                    """SELECT json_extract(payload, '$.page') FROM events
                       WHERE run_id = ? AND kind = 'page_evicted' AND step > ? AND step <= ?
                       AND ts_ns <= ? AND json_extract(payload, '$.action') = 'offloaded'""",
                    (at.run_id, -1 if previous is None else previous, snapshot.step, at.ts_ns),
                )
                if 0 <= page < len(owners) and owners[page] == PAGE_EVICTED
            ]
            owners[offloaded] = PAGE_OFFLOADED
        rows = self.conn.execute(
            f"""SELECT step, ts_ns, kind, request_id, payload FROM events WHERE run_id = ?
               AND kind IN ('pages_allocated', 'pages_freed', 'block_stored',
                            'block_removed', 'page_evicted', 'all_blocks_cleared')
               AND step > ? AND step <= ? AND ts_ns <= ?
               ORDER BY step, ts_ns, {_REPLAY_ORDER}, id""",
            (at.run_id, snapshot.step, at.step, at.ts_ns),
        ).fetchall()
        for _, group in groupby(rows, key=itemgetter(0, 1)):
            _apply_page_events(
                owners, [(kind, rid, json.loads(p or "{}")) for *_, kind, rid, p in group], tree
            )
        return owners

    def _requests(self, at: _At, t_s: float, pages: np.ndarray | None) -> list[RequestState]:
        """Requests that had arrived by ``t_s``, in the state they were in then."""
        changes = self.conn.execute(
            """SELECT request_id, kind FROM events WHERE run_id = ?
               AND kind IN ('request_preempted', 'request_resumed')
               AND ts_ns <= ? AND step <= ? ORDER BY step, ts_ns, id""",
            (at.run_id, at.ts_ns, at.step),
        ).fetchall()
        last_change = dict(changes)
        preemptions = Counter(rid for rid, kind in changes if kind == "request_preempted")
        owners = pages if pages is not None else np.empty(0, np.int32)
        held = np.bincount(owners[owners >= 0]) if owners.size else np.empty(0, np.int64)
        states = []
        for r in queries.requests_table(self.conn, at.run_id):
            if r.arrival_s is not None and r.arrival_s > t_s:
                continue

            def by(offset: float | None, r: queries.RequestRow = r) -> bool:
                return offset is not None and (r.arrival_s or 0.0) + offset <= t_s

            finished = r.status == "finished" and by(r.e2e_s)
            if r.status == "rejected":
                state = "rejected"
            elif finished:
                state = "finished"
            elif last_change.get(r.request_id) == "request_preempted":
                state = "preempted"
            elif by(r.queue_s):
                state = "running"
            else:
                state = "waiting"
            states.append(
                RequestState(
                    request_id=r.request_id,
                    state=state,
                    prompt_tokens=r.prompt_tokens,
                    output_tokens=r.output_tokens if finished else None,
                    cached_tokens=r.cached_tokens if state != "waiting" else None,
                    pages=int(held[r.request_id]) if r.request_id < len(held) else 0,
                    ttft_s=r.ttft_s if by(r.ttft_s) else None,
                    tpot_s=r.tpot_s if finished else None,
                    preemptions=preemptions[r.request_id],
                )
            )
        return states
