"""The page map at any step, rebuilt: the snapshot at or before a position brought
forward through the page events of the steps since (``owners_at``), and exact page
states where the snapshot recorded who holds every page (``step_pages``), with the
heatmap matrix of those states over a run."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

import numpy as np

from kvscope.db.page_states import (
    NUM_STATES,
    PAGE_OFFLOADED,
    StepPages,
    cell_any,
    cell_holder,
    cell_holders,
    cell_mix,
    cell_states,
    step_pages_from,
)
from kvscope.db.pages import PageSnapshot, decode_owners
from kvscope.db.source import Position, Source, connection, kinds_sql, run_origin, window
from kvscope.engine.events import (
    PAGE_CACHED,
    PAGE_EVICTED,
    PAGE_FREE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    PageEvicted,
    PageOffloaded,
    PageReloaded,
    PagesAllocated,
    PagesFreed,
)

_PAGE_EVENT_KINDS = (
    PagesAllocated.kind,
    PagesFreed.kind,
    BlockStored.kind,
    BlockRemoved.kind,
    PageEvicted.kind,
    AllBlocksCleared.kind,
)

# Order of page events with equal timestamps.
_REPLAY_ORDER = f"""CASE kind WHEN '{PagesFreed.kind}' THEN 0 WHEN '{BlockRemoved.kind}' THEN 1
    WHEN '{PageEvicted.kind}' THEN 2 WHEN '{AllBlocksCleared.kind}' THEN 3
    WHEN '{BlockStored.kind}' THEN 4 ELSE 5 END"""


def tree_pages(conn: sqlite3.Connection, at: Position) -> frozenset[int]:
    """Pages in the prefix tree at the position: stored and not removed, evicted
    or cleared since. The latest block event per page decides (as a set, so an
    engine that reports an eviction as both BlockRemoved and PageEvicted is not
    counted twice)."""
    rows = conn.execute(
        f"""WITH cleared AS (
             SELECT COALESCE(MAX(ts_ns), -1) AS ts FROM events
             WHERE run_id = :run AND kind = '{AllBlocksCleared.kind}' AND step <= :step),
           changes AS (
             SELECT e.id, e.step, e.ts_ns, e.kind, CAST(j.value AS INTEGER) AS page
             FROM events e, json_each(e.payload, '$.pages') j
             WHERE e.run_id = :run AND e.kind IN ('{BlockStored.kind}', '{BlockRemoved.kind}')
             AND e.ts_ns <= :hi AND e.step <= :step AND e.ts_ns > (SELECT ts FROM cleared)
             UNION ALL
             SELECT id, step, ts_ns, kind, json_extract(payload, '$.page') FROM events
             WHERE run_id = :run AND kind = '{PageEvicted.kind}'
             AND ts_ns <= :hi AND step <= :step AND ts_ns > (SELECT ts FROM cleared))
           SELECT page FROM (
             SELECT page, kind, ROW_NUMBER() OVER (
               PARTITION BY page ORDER BY step DESC, ts_ns DESC, {_REPLAY_ORDER} DESC, id DESC) AS n
             FROM changes)
           WHERE n = 1 AND kind = '{BlockStored.kind}'""",
        {"run": at.run_id, "hi": at.ts_ns, "step": at.step},
    ).fetchall()
    return frozenset(page for (page,) in rows)


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
        if kind in (PagesAllocated.kind, PagesFreed.kind) and rid is not None:
            for page in event["pages"]:
                if 0 <= page < size:
                    if page not in holds:
                        holds[page] = Counter({int(owners[page]): 1} if owners[page] >= 0 else {})
                    holds[page][rid] += 1 if kind == PagesAllocated.kind else -1
    for kind, _, event in events:
        pages = [p for p in event.get("pages", ()) if 0 <= p < size]
        if kind == PagesFreed.kind:
            owners[pages] = [PAGE_CACHED if p in tree else PAGE_FREE for p in pages]
        elif kind == BlockStored.kind:
            owners[[p for p in pages if owners[p] < 0]] = PAGE_CACHED
        elif kind == BlockRemoved.kind:
            owners[[p for p in pages if owners[p] == PAGE_CACHED]] = PAGE_FREE
        elif kind == PageEvicted.kind and 0 <= event["page"] < size:
            offloaded = event.get("action") == "offloaded"
            owners[event["page"]] = PAGE_OFFLOADED if offloaded else PAGE_EVICTED
        elif kind == AllBlocksCleared.kind:
            owners[owners == PAGE_CACHED] = PAGE_FREE
    for page, counts in holds.items():
        holders = [rid for rid, n in counts.items() if n > 0]
        if holders:
            owners[page] = holders[-1]
        elif owners[page] >= 0:
            owners[page] = PAGE_CACHED if page in tree else PAGE_FREE


def owners_at(
    conn: sqlite3.Connection, at: Position, snapshot: PageSnapshot, tree: frozenset[int]
) -> np.ndarray:
    """Page owners at the position: ``snapshot`` (at or before it) brought forward
    through the page events of the steps since (snapshots come every few steps;
    the events make every step exact). Evicted pages that went to the host tier
    read PAGE_OFFLOADED; ``tree`` is ``tree_pages`` at the position."""
    owners = snapshot.owners.copy()
    if snapshot.pages_evicted:
        previous = conn.execute(
            "SELECT MAX(step) FROM page_maps WHERE run_id = ? AND step < ?",
            (at.run_id, snapshot.step),
        ).fetchone()[0]
        offloaded = [
            page
            for (page,) in conn.execute(
                """SELECT json_extract(payload, '$.page') FROM events
                   WHERE run_id = ? AND kind = ? AND step > ? AND step <= ?
                   AND ts_ns <= ? AND json_extract(payload, '$.action') = 'offloaded'""",
                (
                    at.run_id,
                    PageEvicted.kind,
                    -1 if previous is None else previous,
                    snapshot.step,
                    at.ts_ns,
                ),
            )
            if 0 <= page < len(owners) and owners[page] == PAGE_EVICTED
        ]
        owners[offloaded] = PAGE_OFFLOADED
    rows = conn.execute(
        f"""SELECT step, ts_ns, kind, request_id, payload FROM events WHERE run_id = ?
           AND kind IN ({kinds_sql(_PAGE_EVENT_KINDS)})
           AND step > ? AND step <= ? AND ts_ns <= ?
           ORDER BY step, ts_ns, {_REPLAY_ORDER}, id""",
        (at.run_id, snapshot.step, at.step, at.ts_ns),
    ).fetchall()
    for _, group in groupby(rows, key=itemgetter(0, 1)):
        _apply_page_events(
            owners, [(kind, rid, json.loads(p or "{}")) for *_, kind, rid, p in group], tree
        )
    return owners


_HOLD_EVENT_KINDS = (
    PagesAllocated.kind,
    PagesFreed.kind,
    BlockStored.kind,
    BlockRemoved.kind,
    PageEvicted.kind,
    PageReloaded.kind,
)


def decode_holds(blob: bytes) -> dict[int, list[int]]:
    """``engine.events.encode_holds`` (zlib-compressed) back to request -> pages."""
    flat = decode_owners(blob).tolist()
    holds: dict[int, list[int]] = {}
    i = 0
    while i < len(flat):
        rid, n = flat[i], flat[i + 1]
        holds[rid] = flat[i + 2 : i + 2 + n]
        i += 2 + n
    return holds


def _checkpoint(
    conn: sqlite3.Connection, run_id: int, step: int
) -> tuple[int, int, dict[int, list[int]], set[int]]:
    """(step, num_pages, holds, tree) of the newest exact snapshot at or before
    ``step``; step -1 and empty holds when there is none (replay from the start)."""
    row = conn.execute(
        """SELECT step, num_pages, holds, tree FROM page_maps
           WHERE run_id = ? AND step <= ? AND holds IS NOT NULL
           ORDER BY step DESC, id DESC LIMIT 1""",
        (run_id, step),
    ).fetchone()
    if row is None:
        return -1, 0, {}, set()
    at, num_pages, holds, tree = row
    return at, num_pages, decode_holds(holds), set(decode_owners(tree).tolist()) if tree else set()


def _pool_size(conn: sqlite3.Connection, run_id: int, step: int) -> int | None:
    row = conn.execute(
        """SELECT pages_total FROM steps WHERE run_id = ? AND step <= ?
           ORDER BY step DESC LIMIT 1""",
        (run_id, step),
    ).fetchone()
    if row is None:
        row = conn.execute(
            "SELECT num_pages FROM page_maps WHERE run_id = ? ORDER BY step LIMIT 1", (run_id,)
        ).fetchone()
    return None if row is None else int(row[0])


def has_page_events(conn: sqlite3.Connection, run_id: int) -> bool:
    """Whether the run recorded page holds at all (engine runs; not simulations)."""
    return (
        _records_holds(conn, run_id)
        or conn.execute(
            "SELECT 1 FROM page_maps WHERE run_id = ? AND holds IS NOT NULL LIMIT 1", (run_id,)
        ).fetchone()
        is not None
    )


def _records_holds(conn: sqlite3.Connection, run_id: int) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM events WHERE run_id = ? AND kind = ? LIMIT 1",
            (run_id, PagesAllocated.kind),
        ).fetchone()
        is not None
    )


def step_pages(source: Source, run_id: int, step: int) -> StepPages | None:
    """Every page's state at the end of ``step``, exactly (see db/page_states.py).

    None when the run has no page holds recorded (a simulation, or a run recorded
    before page maps carried holders: ``owners_at`` approximates those).
    """
    with connection(source) as conn:
        start, num_pages, holds, tree = _checkpoint(conn, run_id, step)
        if (start != step or start < 0) and not _records_holds(conn, run_id):
            # no page events: maps with holds (a simulation) are exact at their steps only
            return None
        if (
            start < 0
            and conn.execute(
                "SELECT 1 FROM page_maps WHERE run_id = ? AND step <= ? LIMIT 1", (run_id, step)
            ).fetchone()
        ):
            return None  # maps without holders: an older recording
        num_pages = _pool_size(conn, run_id, step) or num_pages
        rows = conn.execute(
            f"""SELECT step, kind, request_id, payload FROM events WHERE run_id = ?
               AND kind IN ({kinds_sql(_HOLD_EVENT_KINDS)}) AND step > ? AND step <= ?
               ORDER BY step, ts_ns, {_REPLAY_ORDER}, id""",
            (run_id, start, step),
        ).fetchall()
        # This step's evictions, and InfLLM's offloads (a PageOffloaded without a
        # PageEvicted: a request's own block moved to the host tier); the radix cache's
        # offloads carry both, with the same action.
        evictions = conn.execute(
            """SELECT json_extract(payload, '$.page'),
                      CASE kind WHEN ? THEN 'offloaded' ELSE json_extract(payload, '$.action') END
               FROM events WHERE run_id = ? AND kind IN (?, ?) AND step = ? ORDER BY ts_ns, id""",
            (PageOffloaded.kind, run_id, PageEvicted.kind, PageOffloaded.kind, step),
        ).fetchall()
    counts = {rid: Counter(pages) for rid, pages in holds.items()}
    order = {rid: list(pages) for rid, pages in holds.items()}
    for _, kind, rid, payload in rows:
        values = json.loads(payload or "{}")
        if kind == PagesAllocated.kind:
            counts.setdefault(rid, Counter()).update(values["pages"])
            order.setdefault(rid, []).extend(values["pages"])
        elif kind == PagesFreed.kind:
            held = counts.get(rid)
            if held is not None:
                held.subtract(values["pages"])
        elif kind == BlockStored.kind:
            tree.update(values["pages"])
        elif kind == BlockRemoved.kind:
            tree.difference_update(values["pages"])
        elif kind == PageEvicted.kind:
            tree.discard(values["page"])
        elif kind == PageReloaded.kind:
            tree.add(values["page"])
    request_pages = {}
    for rid, held in counts.items():
        left = Counter({p: n for p, n in held.items() if n > 0})
        if not left:
            continue
        pages = []
        for page in order[rid]:
            if left[page] > 0:
                left[page] -= 1
                pages.append(page)
        request_pages[rid] = pages
    evicted = {int(page): action for page, action in evictions}
    return step_pages_from(step, num_pages, request_pages, tree, evicted)


@dataclass(frozen=True, slots=True)
class PageStateMatrix:
    """Page states over time for a heatmap: ``state[page_row, column]`` at ``steps``.

    Every column is an exact ``step_pages`` (any step, not only snapshot steps);
    a row aggregates ``page_stride`` consecutive pages (its dominant state,
    db/page_states.py), ``mix`` says how many pages of each state it holds.
    """

    steps: list[int]
    t_s: list[float]
    state: np.ndarray  # int8 STATE_* (rows, columns)
    holder: np.ndarray  # int32: the highest holder id in the cell, -1 if none
    holders: np.ndarray  # int32: the most holders any page of the cell has
    mix: np.ndarray  # int32 (rows, columns, NUM_STATES)
    page_stride: int
    selected: np.ndarray | None  # bool: the selected request holds a page of the cell


def page_state_matrix(
    source: Source,
    run_id: int,
    max_steps: int = 200,
    max_pages: int | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
    request_id: int | None = None,
) -> PageStateMatrix | None:
    """Exact page states at up to ``max_steps`` steps evenly spread over the window;
    None for a run without page holds (``page_maps`` then)."""
    with connection(source) as conn:
        if (
            not has_page_events(conn, run_id)
            or conn.execute(
                "SELECT 1 FROM page_maps WHERE run_id = ? AND holds IS NULL LIMIT 1", (run_id,)
            ).fetchone()
        ):
            return None
        start_ns = run_origin(conn, run_id)
        lo, hi = window(start_ns, since_s, until_s)
        index = conn.execute(
            "SELECT step, ts_ns FROM steps WHERE run_id = ? AND ts_ns BETWEEN ? AND ? ORDER BY step",
            (run_id, lo, hi),
        ).fetchall()
        if len(index) > max_steps:
            picks = np.unique(np.linspace(0, len(index) - 1, max_steps).round().astype(int))
            index = [index[i] for i in picks]
        kept = [(step_pages(conn, run_id, step), ts) for step, ts in index]
    kept = [(c, ts) for c, ts in kept if c is not None]
    columns = [c for c, _ in kept]
    num_pages = max((c.num_pages for c in columns), default=0)
    stride = max(1, -(-num_pages // max_pages)) if max_pages else 1
    rows = -(-num_pages // stride) if num_pages else 0
    shape = (rows, len(columns))
    state = np.zeros(shape, np.int8)
    holder = np.full(shape, -1, np.int32)
    holders = np.zeros(shape, np.int32)
    mix = np.zeros((*shape, NUM_STATES), np.int32)
    selected = np.zeros(shape, bool) if request_id is not None else None
    for j, c in enumerate(columns):
        n = -(-c.num_pages // stride)
        state[:n, j] = cell_states(c.state, stride)
        holder[:n, j] = cell_holder(c.holder, stride)
        holders[:n, j] = cell_holders(c.holders, stride)
        mix[:n, j] = cell_mix(c.state, stride)
        if selected is not None:
            mask = np.zeros(c.num_pages, bool)
            mask[c.request_pages.get(request_id, np.zeros(0, np.int64))] = True
            selected[:n, j] = cell_any(mask, stride)
    return PageStateMatrix(
        steps=[c.step for c in columns],
        t_s=[(ts - start_ns) / 1e9 for _, ts in kept],
        state=state,
        holder=holder,
        holders=holders,
        mix=mix,
        page_stride=stride,
        selected=selected,
    )


def most_shared_step(source: Source, run_id: int) -> int | None:
    """The step with the most shared pages (the earliest of ties), for pictures that
    should show sharing; None when no step shares a page (or holds are not recorded)."""
    with connection(source) as conn:
        steps = [s for (s,) in conn.execute("SELECT step FROM steps WHERE run_id = ?", (run_id,))]
        best, most = None, 0
        for step in sorted(steps):
            pages = step_pages(conn, run_id, step)
            shared = 0 if pages is None else pages.counts().shared
            if shared > most:
                best, most = step, shared
    return best
