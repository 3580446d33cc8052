"""Time windows over a watch run: the named ones the views offer, their bucket
widths and tiles, and the version a view's cache keys on."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from kvscope.db.source import Source, connection
from kvscope.db.source import window as ts_window
from kvscope.db.watch_aggregates import (
    BUCKET_WIDTHS_S,
)


def version(source: Source, run_id: int) -> tuple:
    """What a view's cache keys on: it changes when a block row, an incident, a
    scrape or the run's status is written, not when only the heartbeat is."""
    with connection(source) as conn:
        applied = conn.execute(
            "SELECT applied_rowid FROM watch_agg_state WHERE run_id = ?", (run_id,)
        ).fetchone()
        incidents = conn.execute(
            "SELECT COUNT(*) FROM watch_incidents WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
        # The newest scrape of any run: only a live watch writes them.
        scrapes = conn.execute("SELECT MAX(rowid) FROM watch_metrics").fetchone()[0]
        counters = conn.execute(
            "SELECT SUM(batches), SUM(bad_messages), SUM(disconnects) FROM watch_sources "
            "WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        status = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    return (applied and applied[0], incidents, scrapes, *counters, status and status[0])


@dataclass(frozen=True, slots=True)
class Window:
    """Seconds since the run's start; None: open."""

    start_s: float | None = None
    end_s: float | None = None


# The windows every watch view offers: the last so many seconds of the recording
# (ending with its newest block event), or the whole session (None).
WINDOWS: tuple[tuple[str, int | None], ...] = (
    ("whole session", None),
    ("last 5 min", 300),
    ("last 15 min", 900),
    ("last 1 h", 3600),
)


def _seconds_span(conn: sqlite3.Connection, run_id: int) -> tuple[int, int] | None:
    """[first, last + 1) second holding block events (the 1 s series buckets), from
    the primary key's ends: two index probes, at any session length."""
    lo, hi = conn.execute(
        "SELECT MIN(bucket), MAX(bucket) FROM watch_series WHERE run_id = ? AND width_s = 1",
        (run_id,),
    ).fetchone()
    return None if lo is None else (lo, hi + 1)


def last_window(source: Source, run_id: int, seconds: int | None) -> Window | None:
    """The last ``seconds`` of the recording, up to the end of its newest 1 s bucket
    (a live watch: about now); None (the whole session) for None."""
    if seconds is None:
        return None
    with connection(source) as conn:
        span = _seconds_span(conn, run_id)
    end = float(span[1]) if span else float(seconds)
    return Window(max(end - seconds, 0.0), end)


def named_window(source: Source, run_id: int, name: str | None) -> tuple[str, Window | None]:
    """One of ``WINDOWS`` by name (None or an unknown name: the whole session): the
    name shown, and its window (``last_window``)."""
    seconds = dict(WINDOWS).get(name or "")
    if seconds is None:
        return WINDOWS[0][0], None
    return name, last_window(source, run_id, seconds)


def window_label(window: Window | None) -> str:
    if window is None:
        return "whole session"
    end = "end" if window.end_s is None else f"{window.end_s:,.0f}"
    return f"t {window.start_s or 0:,.0f}-{end} s"


def _tiles(lo: int, hi: int) -> list[tuple[int, int, int]]:
    """The seconds [lo, hi) as (width, first bucket, last bucket) runs of whole
    buckets: the widest that fit in the middle, narrower ones at the edges, so a
    window of any length sums at most a few hundred rows per source."""
    if lo >= hi:
        return []
    for width in reversed(BUCKET_WIDTHS_S):
        first, last = -(-lo // width), hi // width - 1
        if first <= last:
            return [
                *_tiles(lo, first * width),
                (width, first, last),
                *_tiles((last + 1) * width, hi),
            ]
    raise AssertionError("1 s buckets tile any span")  # BUCKET_WIDTHS_S[0] == 1


def _window_seconds(conn: sqlite3.Connection, run_id: int, window: Window) -> tuple[int, int]:
    """``window`` as whole seconds [lo, hi) from the run's start to its newest block
    event at most, as the whole session's rates are (1 s resolution: a second is
    in when any of it is)."""
    end = (_seconds_span(conn, run_id) or (0, 0))[1]
    lo = 0 if window.start_s is None else max(0, math.floor(window.start_s))
    hi = end if window.end_s is None else min(end, math.ceil(window.end_s))
    return lo, max(hi, lo)


@dataclass(frozen=True, slots=True)
class WindowCounts:
    """One source's block events in a window, summed from the series buckets in it.
    ``new_blocks`` (prefill) and ``both`` are None when any bucket in the window
    lacks them (``SHARES_UNKNOWN``)."""

    source: int
    stored: int
    removed: int
    recomputed: int
    routing_misses: int
    new_blocks: int | None = None
    both: int | None = None


def window_counts(source: Source, run_id: int, window: Window) -> dict[int, WindowCounts]:
    """Per source, the block events of ``window`` (1 s resolution), read from the
    1 h, 1 min and 1 s buckets that tile it exactly: never a bucket outside it."""
    with connection(source) as conn:
        tiles = _tiles(*_window_seconds(conn, run_id, window))
        if not tiles:
            return {}
        one = (
            "SELECT source, stored, removed, recomputed, routing_misses, new_blocks, "
            "both_misses FROM watch_series "
            "WHERE run_id = ? AND width_s = ? AND bucket BETWEEN ? AND ?"
        )
        rows = conn.execute(
            "SELECT source, SUM(stored), SUM(removed), SUM(recomputed), SUM(routing_misses), "
            # NULL where any bucket lacks it: a partial sum would be a wrong share
            "CASE WHEN COUNT(new_blocks) = COUNT(*) THEN SUM(new_blocks) END, "
            "CASE WHEN COUNT(both_misses) = COUNT(*) THEN SUM(both_misses) END "
            f"FROM ({' UNION ALL '.join([one] * len(tiles))}) GROUP BY source ORDER BY source",
            [v for tile in tiles for v in (run_id, *tile)],
        ).fetchall()
    return {row[0]: WindowCounts(*row) for row in rows}


def window_span_s(source: Source, run_id: int, window: Window | None) -> float:
    """Seconds of recording the window's rates are over (the whole session's for None)."""
    with connection(source) as conn:
        if window is None:
            span = _seconds_span(conn, run_id)
            return float(max(span[1], 1)) if span else 1.0
        lo, hi = _window_seconds(conn, run_id, window)
    return float(max(hi - lo, 1))


def _width(conn: sqlite3.Connection, run_id: int, window: Window | None, points: int) -> int:
    """The finest bucket width that shows ``window`` in at most about ``points`` buckets."""
    seconds = _seconds_span(conn, run_id)
    if seconds is None:
        return BUCKET_WIDTHS_S[0]
    lo, hi = seconds[0], seconds[1] - 1
    if window is not None:
        lo = max(lo, int(window.start_s)) if window.start_s is not None else lo
        hi = min(hi, int(window.end_s)) if window.end_s is not None else hi
    span = max(hi - lo + 1, 1)
    for width in BUCKET_WIDTHS_S:
        if span / width <= points:
            return width
    return BUCKET_WIDTHS_S[-1]


def _bucket_range(window: Window | None, width: int) -> tuple[int, int]:
    """The first and last bucket of ``width`` wholly inside ``window``: a graph of
    a window never draws a bucket that began before it or ends after it. 1 s
    buckets: those with any of their second in it, as ``window_counts`` counts."""
    if window is None:
        return -(2**62), 2**62
    inside = width > 1
    lo, hi = -(2**62), 2**62
    if window.start_s is not None:
        lo = math.ceil(window.start_s / width) if inside else math.floor(window.start_s)
    if window.end_s is not None:
        hi = (math.floor(window.end_s / width) if inside else math.ceil(window.end_s)) - 1
    return lo, hi


def _bucket_rows(
    source: Source, run_id: int, window: Window | None, points: int, sql: str
) -> tuple[int, list[tuple]]:
    """``sql`` (placeholders: run, width, first and last bucket) over the buckets of
    the width that shows ``window`` in about ``points``; returns (width, rows)."""
    with connection(source) as conn:
        width = _width(conn, run_id, window, points)
        lo, hi = _bucket_range(window, width)
        return width, conn.execute(sql, (run_id, width, lo, hi)).fetchall()


def _ns(origin: int, window: Window | None) -> tuple[int, int]:
    """``window`` as the nanosecond bounds of raw rows' ``ts_ns`` (open: everything)."""
    if window is None:
        return ts_window(origin, None, None)
    return ts_window(origin, window.start_s, window.end_s)
