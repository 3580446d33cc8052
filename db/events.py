"""Reads of the event log: the event timeline, events per time bucket, counters.

Event kinds are the ``kind`` of the engine's event classes (engine.events
owns the vocabulary); nothing here spells one out. ``events_per_bucket`` is the
one bucketing of events (the TUI's churn sparklines, the dashboard's event
counts); ``prefix_tokens`` the one sum of prefix lookups.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscope.db.source import (
    NO_END,
    NO_START,
    Position,
    Source,
    bucket_sql,
    bucket_width_s,
    connection,
    kinds_sql,
    run_origin,
    window,
)
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import (
    EVENT_TYPES,
    PageEvicted,
    PageOffloaded,
    PageReloaded,
    PrefixLookup,
    RequestPreempted,
    RequestResumed,
)

# Event kinds event_timeline returns unless told otherwise.
TIMELINE_KINDS = (
    PageEvicted.kind,
    PageOffloaded.kind,
    PageReloaded.kind,
    RequestPreempted.kind,
    RequestResumed.kind,
)
# The cache's churn: what the eviction / offload / preemption panels count, in display order.
CHURN_KINDS = (PageEvicted.kind, PageOffloaded.kind, PageReloaded.kind, RequestPreempted.kind)


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    t_s: float
    step: int
    kind: str
    request_id: int | None
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EventCounts:
    """Events per kind in equal time buckets from the run's start."""

    t_s: list[float]  # bucket centres
    bucket_s: float
    counts: dict[str, list[int]]  # kind -> count per bucket (only kinds that occurred)


@dataclass(frozen=True, slots=True)
class Counters:
    """Token and event counters over a span of the run (all of it up to a
    position, or a recent window)."""

    span_s: float
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    churn: dict[str, int] = field(default_factory=dict)  # CHURN_KINDS -> events


def _check_kinds(kinds: Sequence[str]) -> None:
    unknown = [kind for kind in kinds if kind not in EVENT_TYPES]
    if unknown:
        raise KvscopeError(f"unknown event kind {unknown[0]!r} (known: {', '.join(EVENT_TYPES)})")


def event_timeline(
    source: Source,
    run_id: int,
    kinds: Sequence[str] = TIMELINE_KINDS,
    since_s: float | None = None,
    until_s: float | None = None,
    limit: int | None = 1000,
) -> list[TimelineEvent]:
    """Events of the given kinds (evictions, offloads, reloads, preemptions by
    default), oldest first; with ``limit``, only the latest ``limit`` of them."""
    _check_kinds(kinds)
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        lo, hi = window(start_ns, since_s, until_s)
        rows = conn.execute(
            f"""SELECT ts_ns, step, kind, request_id, payload FROM events
                WHERE run_id = ? AND kind IN ({kinds_sql(kinds)})
                AND ts_ns BETWEEN ? AND ? ORDER BY ts_ns DESC, id DESC LIMIT ?""",
            (run_id, lo, hi, -1 if limit is None else limit),
        ).fetchall()
    return [
        TimelineEvent((ts_ns - start_ns) / 1e9, step, kind, rid, json.loads(payload or "{}"))
        for ts_ns, step, kind, rid, payload in reversed(rows)
    ]


def prefix_tokens(
    conn: sqlite3.Connection,
    run_id: int,
    lo_ns: int = NO_START,
    hi_ns: int = NO_END,
    *,
    bucket: str = "0",
    max_step: int | None = None,
) -> dict[int, tuple[int, int]]:
    """(queried tokens, hit tokens) of the prefix lookups in [lo_ns, hi_ns] (and
    at most ``max_step``), per value of the SQL expression ``bucket``; a preempted
    request's re-lookups are not counted (engine/events.py, ``PrefixLookup``)."""
    rows = conn.execute(
        f"""SELECT {bucket} AS b, SUM(json_extract(payload, '$.queried_tokens')),
                   SUM(json_extract(payload, '$.hit_tokens'))
            FROM events WHERE run_id = ? AND kind = ? AND ts_ns BETWEEN ? AND ?
            AND step <= ? AND NOT COALESCE(json_extract(payload, '$.preempted'), 0)
            GROUP BY b""",
        (run_id, PrefixLookup.kind, lo_ns, hi_ns, NO_END if max_step is None else max_step),
    ).fetchall()
    return {b: (queried or 0, hit or 0) for b, queried, hit in rows}


def events_per_bucket(
    conn: sqlite3.Connection,
    run_id: int,
    kinds: Sequence[str],
    lo_ns: int,
    hi_ns: int,
    buckets: int,
    max_step: int | None = None,
) -> dict[str, list[int]]:
    """How many events of each kind fell in each of ``buckets`` equal parts of
    [lo_ns, hi_ns] (see db.source.bucket_sql), counted in SQL."""
    counts = {kind: [0] * buckets for kind in kinds}
    rows = conn.execute(
        f"""SELECT kind, {bucket_sql(lo_ns, hi_ns, buckets)}, COUNT(*) FROM events
            WHERE run_id = ? AND kind IN ({kinds_sql(kinds)}) AND ts_ns BETWEEN ? AND ?
            AND step <= ? GROUP BY 1, 2""",
        (run_id, lo_ns, hi_ns, NO_END if max_step is None else max_step),
    ).fetchall()
    for kind, b, n in rows:
        counts[kind][b] += n
    return counts


def event_counts(
    source: Source, run_id: int, kinds: Sequence[str] = TIMELINE_KINDS, max_points: int = 200
) -> EventCounts:
    """Each kind's events in at most ``max_points`` equal buckets from the run's
    start to its last step or event, so the cost does not grow with what is
    sent to the browser."""
    _check_kinds(kinds)
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        end_ns = conn.execute(
            f"""SELECT MAX(t) FROM (
                  SELECT MAX(ts_ns) AS t FROM steps WHERE run_id = ?1
                  UNION ALL SELECT MAX(ts_ns) FROM events
                  WHERE run_id = ?1 AND kind IN ({kinds_sql(kinds)}))""",
            (run_id,),
        ).fetchone()[0]
        if end_ns is None:
            return EventCounts([], 0.0, {})
        n = min(max_points, end_ns - start_ns + 1)
        counts = events_per_bucket(conn, run_id, kinds, start_ns, end_ns, n)
    width_s = bucket_width_s(start_ns, end_ns, n)
    return EventCounts(
        [(i + 0.5) * width_s for i in range(n)],
        width_s,
        {kind: per for kind, per in counts.items() if any(per)},
    )


def tally(
    conn: sqlite3.Connection,
    run_id: int,
    lo_ns: int = NO_START,
    hi_ns: int = NO_END,
    max_step: int | None = None,
    span_s: float = 0.0,
) -> Counters:
    """Tokens computed, prefix-lookup tokens (the hit rate) and churn events
    (evictions, offloads, reloads, preemptions) in [lo_ns, hi_ns] and at most
    ``max_step``; by default the whole run.

    The one function behind these figures wherever they appear: the TUI's running
    counters (``counters``) and the run summary (``db.runs.run_summary``: the
    dashboard, the report, ``kvscope runs`` and the end-of-run summary)."""
    step = NO_END if max_step is None else max_step
    churn = dict.fromkeys(CHURN_KINDS, 0)
    churn.update(
        conn.execute(
            f"""SELECT kind, COUNT(*) FROM events WHERE run_id = ?
                AND kind IN ({kinds_sql(CHURN_KINDS)}) AND ts_ns BETWEEN ? AND ?
                AND step <= ? GROUP BY kind""",
            (run_id, lo_ns, hi_ns, step),
        ).fetchall()
    )
    queried, hit = prefix_tokens(conn, run_id, lo_ns, hi_ns, max_step=max_step).get(0, (0, 0))
    prefill, decode = conn.execute(
        """SELECT SUM(prefill_tokens), SUM(decode_tokens) FROM steps
           WHERE run_id = ? AND ts_ns BETWEEN ? AND ? AND step <= ?""",
        (run_id, lo_ns, hi_ns, step),
    ).fetchone()
    return Counters(span_s, prefill or 0, decode or 0, queried, hit, churn)


def counters(conn: sqlite3.Connection, at: Position, span_s: float) -> Counters:
    """``tally`` over the ``span_s`` seconds up to the position (the window excludes
    its start)."""
    lo, hi = at.ts_ns - round(span_s * 1e9) + 1, at.ts_ns
    return tally(conn, at.run_id, lo, hi, at.step, span_s)
