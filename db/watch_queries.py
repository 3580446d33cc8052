"""Read queries over a watched deployment (run kind ``watch``), for every front end.

Block-level figures read the aggregates the recorder keeps as it writes
(``db.watch_aggregates``), never the raw ``watch_blocks``: a refresh costs the
window it shows, not the length of the watch. Cached blocks and copies by
medium, lifetimes, re-announced blocks, recomputation after eviction and
routing misses, clears and restarts, blocks held by several replicas at once,
the prefix tree's largest shared prefixes. Hashes compare only within one engine kind, so every
cross-source figure groups by ``engine``. /metrics figures are rates of
counters between scrapes (never an engine's own hit-rate gauge, which SGLang
overwrites per batch). Times are seconds since the run's start (``t_s``).
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from kvscope.db.source import Source, connection, run_origin
from kvscope.db.source import window as ts_window
from kvscope.db.watch_aggregates import (
    BUCKET_WIDTHS_S,
    NO_MEDIUM,
    STAT_COLUMNS,
    bin_edges_s,
)
from kvscope.db.watch_schema import table_columns

# /metrics names per figure and engine kind (see docs/watch.md).
METRIC_NAMES: dict[str, dict[str, str]] = {
    "usage": {"vllm": "vllm:kv_cache_usage_perc", "sglang": "sglang:token_usage"},
    "running": {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"},
    "waiting": {"vllm": "vllm:num_requests_waiting", "sglang": "sglang:num_queue_reqs"},
    "preemptions": {
        "vllm": "vllm:num_preemptions_total",
        "sglang": "sglang:num_retracted_requests_total",
    },
    "hits": {"vllm": "vllm:prefix_cache_hits_total", "sglang": "sglang:cached_tokens_total"},
    "queries": {
        "vllm": "vllm:prefix_cache_queries_total",
        "sglang": "sglang:prompt_tokens_total",
    },
    "ttft": {
        "vllm": "vllm:time_to_first_token_seconds",
        "sglang": "sglang:time_to_first_token_seconds",
    },
    "itl": {
        "vllm": "vllm:inter_token_latency_seconds",
        "sglang": "sglang:inter_token_latency_seconds",
    },
}


@dataclass(frozen=True, slots=True)
class WatchSource:
    """One row of ``watch_sources``."""

    source: int
    kind: str
    engine: str
    endpoint: str
    replay: str | None
    topic: str | None
    dp_rank: int | None
    listen: bool
    block_size: int | None
    last_seq: int | None
    batches: int
    events: int
    block_events: int
    gaps: int
    recovered_batches: int
    lost_batches: int
    restarts: int
    disconnects: int
    bad_messages: int
    attrs: str | None

    @property
    def label(self) -> str:
        rank = "" if self.dp_rank is None else f" dp{self.dp_rank}"
        return f"{self.source}: {self.endpoint}{rank}"


def attrs_summary(attrs: str | None) -> str:
    """A source's newer per-event fields in a few words: hybrid groups and their
    spec kinds, LoRAs, session ids, cache salts, locality, ownership, extra keys."""
    try:
        a = json.loads(attrs or "{}")
    except ValueError:
        return ""
    parts = []
    groups = a.get("groups") or {}
    if len(groups) > 1 or any(kind not in (None, "full_attention") for kind in groups.values()):
        parts.append("groups " + " ".join(f"{g}:{kind or '?'}" for g, kind in groups.items()))
    if a.get("lora_names"):
        parts.append("LoRA " + ", ".join(a["lora_names"]))
    for key, name in (("session_ids", "sessions"), ("cache_salts", "cache salts")):
        seen = a.get(key) or {}
        if seen.get("count"):
            parts.append(f"{'>=' if seen.get('at_least') else ''}{seen['count']:,} {name}")
    for key in ("localities", "ownerships"):
        if a.get(key):
            parts.append(f"{key[:-3]}y " + ", ".join(a[key]))
    if a.get("extra_keys_events"):
        parts.append(f"extra keys on {a['extra_keys_events']:,} stores")
    return "; ".join(parts)


def watch_sources(source: Source, run_id: int) -> list[WatchSource]:
    names = ", ".join(f.name for f in WatchSource.__dataclass_fields__.values())
    with connection(source) as conn:
        rows = conn.execute(
            f"SELECT {names} FROM watch_sources WHERE run_id = ? ORDER BY source", (run_id,)
        ).fetchall()
    return [WatchSource(*row[:7], bool(row[7]), *row[8:]) for row in rows]


# --- block figures, from the aggregates -------------------------------------------------


def _medium(value: str) -> str | None:
    return None if value == NO_MEDIUM else value


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
class CachedPoint:
    """Cached blocks of one source and medium at the end of the bucket ending ``t_s``."""

    t_s: float
    source: int
    medium: str | None
    blocks: int


@dataclass(frozen=True, slots=True)
class DuplicatePoint:
    """Blocks of one engine kind held by more than one source at ``t_s``."""

    t_s: float
    engine: str
    duplicated_blocks: int  # distinct hashes on >= 2 sources
    extra_copies: int  # copies beyond the first: the wasted ones


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


# What a view says where a window's prefill is unknown: buckets that schema v8's
# migration could not fill (their raw rows were trimmed by --keep-raw before it).
SHARES_UNKNOWN = "shares unknown for this window (recorded before v8)"


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


def cached_series(
    source: Source, run_id: int, window: Window | None = None, *, points: int = 1500
) -> list[CachedPoint]:
    """Cached blocks per source and medium over time: the value at the end of each
    bucket (1 s, 1 min or 1 h wide, whichever shows ``window`` in ``points``)."""
    width, rows = _bucket_rows(
        source,
        run_id,
        window,
        points,
        "SELECT bucket, source, medium, live FROM watch_series WHERE run_id = ? "
        "AND width_s = ? AND bucket BETWEEN ? AND ? ORDER BY bucket, source, medium",
    )
    return [CachedPoint(float((b + 1) * width), s, _medium(m), n) for b, s, m, n in rows]


def duplicate_series(
    source: Source, run_id: int, window: Window | None = None, *, points: int = 1500
) -> list[DuplicatePoint]:
    width, rows = _bucket_rows(
        source,
        run_id,
        window,
        points,
        "SELECT bucket, engine, duplicated, extra_copies FROM watch_fleet_series "
        "WHERE run_id = ? AND width_s = ? AND bucket BETWEEN ? AND ? ORDER BY bucket, engine",
    )
    return [DuplicatePoint(float((b + 1) * width), e, d, x) for b, e, d, x in rows]


@dataclass(frozen=True, slots=True)
class MissPoint:
    """Fleet-wide misses in one bucket, as rates."""

    t_s: float
    engine: str
    stored_per_s: float  # block events stored (prefill paid, and re-announcements)
    recomputed_per_s: float
    routing_misses_per_s: float


def miss_series(
    source: Source, run_id: int, window: Window | None = None, *, points: int = 1500
) -> list[MissPoint]:
    """Recomputations after eviction and routing misses per second, per engine kind
    (blocks; times the block size for tokens)."""
    width, rows = _bucket_rows(
        source,
        run_id,
        window,
        points,
        "SELECT w.bucket, s.engine, SUM(w.stored), SUM(w.recomputed), SUM(w.routing_misses) "
        "FROM watch_series w JOIN watch_sources s ON s.run_id = w.run_id AND s.source = w.source "
        "WHERE w.run_id = ? AND w.width_s = ? AND w.bucket BETWEEN ? AND ? "
        "GROUP BY w.bucket, s.engine ORDER BY w.bucket",
    )
    return [
        MissPoint(float((b + 1) * width), e, st / width, rc / width, rm / width)
        for b, e, st, rc, rm in rows
    ]


@dataclass(frozen=True, slots=True)
class BlockStats:
    """One source's block figures over the whole watch."""

    source: int
    stored: int
    removed: int
    reannounced: int  # stored while held: a hit re-announced, or a second physical copy
    recomputed: int
    removed_unknown: int
    clears: int
    resets: int
    cached: dict[str | None, int]  # blocks held now, by medium
    lifetime_count: int
    lifetime_mean_s: float | None
    lifetime_p50_s: float | None  # from the histogram: within a quarter octave
    lifetime_p90_s: float | None
    # stored while held on no medium of the source: prefill paid (None: a window
    # recorded before v8 whose raw rows were trimmed, SHARES_UNKNOWN)
    new_blocks: int | None = 0
    routing_misses: int = 0
    copies: dict[str | None, int] = field(default_factory=dict)  # physical copies, by medium
    # blocks held now by "medium/group": hybrid models' groups apart
    by_group: dict[str, int] = field(default_factory=dict)
    # removals let go of under the fold's fleet-wide memory (EVICTED_MEMORY): a
    # re-store of one counted as new prefill, so recomputed is a lower bound when > 0
    forgotten_removals: int = 0


def _quantile(bins: list[tuple[int, int]], q: float) -> float | None:
    """The ``q`` quantile of a histogram, at the geometric middle of its bin."""
    total = sum(n for _, n in bins)
    if not total:
        return None
    rank = q * total
    seen = 0
    for b, n in sorted(bins):
        seen += n
        if seen >= rank:
            low, high = bin_edges_s(b)
            return math.sqrt(low * high) if low else high / 2
    return None


def _histograms(conn: sqlite3.Connection, run_id: int, name: str) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for src, b, n in conn.execute(
        "SELECT source, bin, count FROM watch_histograms WHERE run_id = ? AND name = ?",
        (run_id, name),
    ):
        out[src].append((b, n))
    return out


def block_stats(source: Source, run_id: int, window: Window | None = None) -> list[BlockStats]:
    """Per-source figures, in source order (events sources only). With ``window``,
    stored, new (prefill), removed, recomputed and routing misses are the window's
    (``window_counts``); what is held is now, and the rest the whole session's
    (the series keep no per-bucket re-announcements, lifetimes or clears)."""
    counts = None if window is None else window_counts(source, run_id, window)
    with connection(source) as conn:
        names = ", ".join(STAT_COLUMNS)
        # schema v9's column; a file older than that opened read-only has none
        has_forgotten = "forgotten_removals" in table_columns(conn, "watch_source_stats")
        forgotten = ", forgotten_removals" if has_forgotten else ", 0"
        rows = conn.execute(
            f"SELECT source, {names}{forgotten} FROM watch_source_stats WHERE run_id = ? "
            "ORDER BY source",
            (run_id,),
        ).fetchall()
        live: dict[int, dict] = defaultdict(lambda: defaultdict(int))
        copies: dict[int, dict] = defaultdict(lambda: defaultdict(int))
        groups: dict[int, dict] = defaultdict(dict)
        for src, medium, group, blocks, n in conn.execute(
            "SELECT source, medium, group_idx, blocks, copies FROM watch_live WHERE run_id = ?",
            (run_id,),
        ):
            live[src][_medium(medium)] += blocks
            copies[src][_medium(medium)] += n
            if blocks:
                groups[src][f"{_medium(medium) or '?'}/{group}"] = blocks
        lifetimes = _histograms(conn, run_id, "lifetime")
    out = []
    for row in rows:
        src, values = row[0], dict(zip(STAT_COLUMNS, row[1:-1], strict=True))
        count = values["lifetime_count"]
        out.append(
            BlockStats(
                src,
                values["stored"],
                values["removed"],
                values["reannounced"],
                values["recomputed"],
                values["removed_unknown"],
                values["clears"],
                values["resets"],
                {m: n for m, n in live[src].items() if n},
                count,
                values["lifetime_sum_s"] / count if count else None,
                _quantile(lifetimes.get(src, []), 0.5),
                _quantile(lifetimes.get(src, []), 0.9),
                values["new_blocks"],
                values["routing_misses"],
                {m: n for m, n in copies[src].items() if n},
                groups[src],
                row[-1],
            )
        )
    if counts is None:
        return out
    return [
        replace(
            s,
            stored=(c := _counts_of(counts, s.source)).stored,
            new_blocks=c.new_blocks,
            removed=c.removed,
            recomputed=c.recomputed,
            routing_misses=c.routing_misses,
        )
        for s in out
    ]


def _counts_of(counts: dict[int, WindowCounts], source: int) -> WindowCounts:
    """A source's counts in a window; one with no bucket in it had none of anything."""
    return counts.get(source) or WindowCounts(source, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Misses:
    """The two misses a fleet operator pays for, for one source or (``source`` None)
    a whole engine kind. Tokens are blocks times the source's block size."""

    engine: str
    source: int | None
    span_s: float  # the watch's (or the window's) length the rates are over
    # prefill paid: blocks stored new on a source (the window's, with one); None,
    # and so the shares, in a window recorded before v8 (SHARES_UNKNOWN)
    new_blocks: int | None
    new_tokens: int | None
    recomputed: int  # recomputation after eviction: more KV (or offload) would have saved it
    recomputed_tokens: int | None
    routing_misses: int  # held by another source: a KV-aware router would have hit it
    routing_miss_tokens: int | None
    both: int | None  # both at once (None where new_blocks is)

    @property
    def recomputed_share(self) -> float | None:
        return self.recomputed / self.new_blocks if self.new_blocks else None

    @property
    def routing_share(self) -> float | None:
        return self.routing_misses / self.new_blocks if self.new_blocks else None

    def per_s(self, tokens: int | None) -> float | None:
        return None if tokens is None else tokens / self.span_s


def misses(source: Source, run_id: int, window: Window | None = None) -> list[Misses]:
    """Per events source, then one fleet-wide row per engine kind (``source`` None);
    over ``window`` (its buckets: ``window_counts``) when given: counts, shares of
    the window's prefill, and tokens/s over the window's seconds."""
    srcs = {s.source: s for s in watch_sources(source, run_id) if s.kind == "events"}
    span = window_span_s(source, run_id, window)
    if window is None:
        with connection(source) as conn:
            stats = conn.execute(
                "SELECT source, new_blocks, recomputed, routing_misses, both_misses "
                "FROM watch_source_stats WHERE run_id = ? ORDER BY source",
                (run_id,),
            ).fetchall()
    else:
        counts = window_counts(source, run_id, window)
        stats = [
            (
                src,
                (c := _counts_of(counts, src)).new_blocks,
                c.recomputed,
                c.routing_misses,
                c.both,
            )  # fmt: skip
            for src in sorted(srcs)
        ]

    def tokens(blocks: int | None, sizes: list[int | None]) -> int | None:
        if blocks is None or any(s is None for s in sizes) or len(set(sizes)) > 1:
            return None
        return blocks * sizes[0] if sizes else 0

    def of(
        engine: str,
        src: int | None,
        new: int | None,
        rc: int,
        rm: int,
        both: int | None,
        sizes: list,
    ) -> Misses:
        t = [tokens(n, sizes) for n in (new, rc, rm)]
        return Misses(engine, src, span, new, t[0], rc, t[1], rm, t[2], both)

    out = []
    fleet: dict[str, list] = {}
    for src, new, rc, rm, both in stats:
        info = srcs.get(src)
        if info is None:
            continue
        out.append(of(info.engine, src, new, rc, rm, both, [info.block_size]))
        acc = fleet.setdefault(info.engine, [0, 0, 0, 0, []])
        for i, v in enumerate((new, rc, rm, both)):
            acc[i] = None if v is None or acc[i] is None else acc[i] + v
        acc[4].append(info.block_size)
    out += [of(engine, None, *acc) for engine, acc in sorted(fleet.items())]
    return out


@dataclass(frozen=True, slots=True)
class HistogramBin:
    low_s: float
    high_s: float
    count: int


def histogram(
    source: Source, run_id: int, name: str, *, of_source: int | None = None
) -> list[HistogramBin]:
    """One of ``HISTOGRAMS`` (lifetime, idle_before_evict, reuse_gap, restore_gap),
    summed over sources unless ``of_source``; quarter-octave bins from 1 ms."""
    where = "" if of_source is None else f" AND source = {int(of_source)}"
    with connection(source) as conn:
        rows = conn.execute(
            f"SELECT bin, SUM(count) FROM watch_histograms WHERE run_id = ? AND name = ?{where} "
            "GROUP BY bin ORDER BY bin",
            (run_id, name),
        ).fetchall()
    return [HistogramBin(*bin_edges_s(b), n) for b, n in rows]


@dataclass(frozen=True, slots=True)
class Duplication:
    """Blocks of one engine kind cached on several sources at once."""

    engine: str
    duplicated_blocks: int
    extra_copies: int
    extra_tokens: int | None  # extra copies x block size, when the sources share one
    peak_extra_copies: int


def duplication(source: Source, run_id: int) -> list[Duplication]:
    """Duplicated KV across replicas now and at peak, per engine kind (wasted bytes =
    extra_tokens x the model's KV bytes per token)."""
    sizes: dict[str, set] = defaultdict(set)
    for s in watch_sources(source, run_id):
        if s.kind == "events":
            sizes[s.engine].add(s.block_size)
    with connection(source) as conn:
        rows = conn.execute(
            "SELECT engine, duplicated, extra_copies, peak_extra_copies FROM watch_fleet "
            "WHERE run_id = ? ORDER BY engine",
            (run_id,),
        ).fetchall()
    out = []
    for engine, dup, extra, peak in rows:
        if engine not in sizes:
            continue
        one = sizes[engine]
        tokens = extra * next(iter(one)) if len(one) == 1 and None not in one else None
        out.append(Duplication(engine, dup, extra, tokens, peak))
    return out


@dataclass(frozen=True, slots=True)
class TreeSummary:
    engine: str
    nodes: int  # distinct blocks ever stored
    roots: int  # chains whose first parent was never seen stored
    branch_points: int
    max_depth: int


def tree_summary(source: Source, run_id: int) -> list[TreeSummary]:
    with connection(source) as conn:
        rows = conn.execute(
            "SELECT engine, tree_nodes, tree_roots, branch_points, max_depth FROM watch_fleet "
            "WHERE run_id = ? AND tree_nodes > 0 ORDER BY engine",
            (run_id,),
        ).fetchall()
    return [TreeSummary(*row) for row in rows]


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """A block where sequences diverge: the prefix up to it is shared by ``branches``."""

    engine: str
    block_hash: int  # signed 64-bit, as stored
    depth_blocks: int  # blocks from the root to this one, inclusive
    prefix_tokens: int | None
    branches: int  # children: continuations that share the prefix
    subtree_blocks: int  # blocks stored under it (it included)
    sources: tuple[int, ...]  # sources that stored it


def prefix_tree(source: Source, run_id: int, *, top: int = 10) -> list[SharedPrefix]:
    """The largest shared prefixes of the tree rebuilt from ``parent_hash`` chains
    of every block ever stored: branch points ranked by the tokens their prefix
    spans times the extra continuations sharing it (what prefix caching saves)."""
    sizes = {s.source: s.block_size for s in watch_sources(source, run_id)}
    with connection(source) as conn:
        rows = conn.execute(
            "SELECT engine, block_hash, depth_blocks, branches, subtree_blocks, sources "
            "FROM watch_shared_prefixes WHERE run_id = ? ORDER BY rank LIMIT ?",
            (run_id, top),
        ).fetchall()
    out = []
    for engine, block, depth, branches, subtree, srcs in rows:
        held = tuple(int(s) for s in srcs.split(",") if s)
        size = sizes.get(held[0]) if held else None
        tokens = None if size is None else depth * size
        out.append(SharedPrefix(engine, block, depth, tokens, branches, subtree, held))
    return out


# --- /metrics ----------------------------------------------------------------------------


def _ns(origin: int, window: Window | None) -> tuple[int, int]:
    """``window`` as the nanosecond bounds of raw rows' ``ts_ns`` (open: everything)."""
    if window is None:
        return ts_window(origin, None, None)
    return ts_window(origin, window.start_s, window.end_s)


@dataclass(frozen=True, slots=True)
class MetricPoint:
    t_s: float
    value: float


def metric_names(source: Source, run_id: int) -> list[str]:
    with connection(source) as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT DISTINCT name FROM watch_metrics WHERE run_id = ? ORDER BY name", (run_id,)
            )
        ]


def metric_series(
    source: Source,
    run_id: int,
    name: str,
    *,
    metrics_source: int | None = None,
    mean: bool = False,
    window: Window | None = None,
) -> list[MetricPoint]:
    """A sample name per scrape (those in ``window`` only), summed (or averaged, for
    ratios) over its label sets."""
    agg = "AVG" if mean else "SUM"
    where = "" if metrics_source is None else f" AND source = {int(metrics_source)}"
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        lo, hi = _ns(origin, window)
        rows = conn.execute(
            f"SELECT ts_ns, {agg}(value) FROM watch_metrics WHERE run_id = ? AND name = ?{where} "
            "AND ts_ns BETWEEN ? AND ? GROUP BY source, ts_ns ORDER BY ts_ns",
            (run_id, name, lo, hi),
        ).fetchall()
    return [MetricPoint((ts - origin) / 1e9, value) for ts, value in rows]


def counter_rate(points: list[MetricPoint]) -> list[MetricPoint]:
    """Per-second rate between consecutive samples; a drop (an engine restart) starts afresh."""
    out = []
    for before, after in zip(points, points[1:], strict=False):
        dt = after.t_s - before.t_s
        if dt <= 0:
            continue
        delta = after.value - before.value if after.value >= before.value else after.value
        out.append(MetricPoint(after.t_s, delta / dt))
    return out


def ratio_of_rates(
    numerator: list[MetricPoint], denominator: list[MetricPoint]
) -> list[MetricPoint]:
    """rate(numerator) / rate(denominator) at the samples both have (hit rate, mean latency)."""
    den = {p.t_s: p.value for p in counter_rate(denominator)}
    return [
        MetricPoint(p.t_s, p.value / den[p.t_s]) for p in counter_rate(numerator) if den.get(p.t_s)
    ]


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """The /metrics figures of one metrics source, named the same for vLLM and SGLang."""

    source: int
    engine: str
    usage: list[MetricPoint]  # block-level for vLLM, token-level for SGLang
    usage_level: str
    running: list[MetricPoint]
    waiting: list[MetricPoint]
    preemptions_per_s: list[MetricPoint]
    hit_rate: list[MetricPoint]  # rate(hits) / rate(queries), tokens
    ttft_mean_s: list[MetricPoint]
    itl_mean_s: list[MetricPoint]


def engine_series(source: Source, run_id: int, window: Window | None = None) -> list[EngineSeries]:
    """For every /metrics source of the run, its usage, load, hit rate and latencies
    (the scrapes of ``window`` only)."""
    out = []
    for src in watch_sources(source, run_id):
        if src.kind != "metrics":
            continue

        def series(
            figure: str, suffix: str = "", mean: bool = False, src: WatchSource = src
        ) -> list[MetricPoint]:
            name = METRIC_NAMES[figure][src.engine] + suffix
            return metric_series(
                source, run_id, name, metrics_source=src.source, mean=mean, window=window
            )

        out.append(
            EngineSeries(
                src.source,
                src.engine,
                series("usage", mean=True),
                "blocks" if src.engine == "vllm" else "tokens",
                series("running"),
                series("waiting"),
                counter_rate(series("preemptions")),
                ratio_of_rates(series("hits"), series("queries")),
                ratio_of_rates(series("ttft", "_sum"), series("ttft", "_count")),
                ratio_of_rates(series("itl", "_sum"), series("itl", "_count")),
            )
        )
    return out


RESIDENCY_METRICS = {
    "lifetime": "vllm:kv_block_lifetime_seconds_bucket",
    "idle_before_evict": "vllm:kv_block_idle_before_evict_seconds_bucket",
    "reuse_gap": "vllm:kv_block_reuse_gap_seconds_bucket",
}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels(text: str) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def residency(source: Source, run_id: int) -> dict[str, list[HistogramBin]]:
    """vLLM's sampled residency histograms (``--kv-cache-metrics``) as of each metrics
    source's latest scrape, summed over sources and label sets: per bucket (not
    cumulative), named as kvscope's own (``histogram``). Empty without the flag."""
    out: dict[str, list[HistogramBin]] = {}
    with connection(source) as conn:
        for figure, name in RESIDENCY_METRICS.items():
            # The newest value of every (source, labels) series: buckets are kept
            # only when they change, so each series' own latest row, not one scrape.
            rows = conn.execute(
                # SQLite takes the bare columns from the row of MAX(ts_ns).
                "SELECT labels, value, MAX(ts_ns) FROM watch_metrics WHERE run_id = ? AND "
                "name = ? GROUP BY source, labels",
                (run_id, name),
            ).fetchall()
            cumulative: dict[float, float] = defaultdict(float)
            for labels, value, _ in rows:
                le = _labels(labels).get("le")
                if le is not None:
                    cumulative[math.inf if le == "+Inf" else float(le)] += value
            bins, low, below = [], 0.0, 0.0
            for high in sorted(cumulative):
                bins.append(HistogramBin(low, high, int(cumulative[high] - below)))
                low, below = high, cumulative[high]
            if bins:
                out[figure] = bins
    return out


@dataclass(frozen=True, slots=True)
class CacheSources:
    """vLLM's prompt tokens by where their KV came from, and its external cache."""

    source: int
    by_source_per_s: dict[str, list[MetricPoint]]  # prompt_tokens_cached_by_source rate
    external_hit_rate: list[MetricPoint]  # rate(external hits) / rate(external queries)


def cache_sources(source: Source, run_id: int, window: Window | None = None) -> list[CacheSources]:
    """``vllm:prompt_tokens_cached_by_source_total{source}`` as rates per source label
    and the external prefix cache's hit rate (an offload tier, LMCache), per
    metrics source that reports them (the scrapes of ``window`` only)."""
    out = []
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        lo, hi = _ns(origin, window)
        for (src,) in conn.execute(
            "SELECT source FROM watch_sources WHERE run_id = ? AND kind = 'metrics' "
            "ORDER BY source",
            (run_id,),
        ).fetchall():
            by_label: dict[str, list[MetricPoint]] = defaultdict(list)
            for ts, labels, value in conn.execute(
                "SELECT ts_ns, labels, SUM(value) FROM watch_metrics WHERE run_id = ? AND name = ? "
                "AND source = ? AND ts_ns BETWEEN ? AND ? GROUP BY ts_ns, labels ORDER BY ts_ns",
                (run_id, "vllm:prompt_tokens_cached_by_source_total", src, lo, hi),
            ):
                kind = _labels(labels).get("source", "?")
                by_label[kind].append(MetricPoint((ts - origin) / 1e9, value))
            hits = metric_series(conn, run_id, "vllm:external_prefix_cache_hits_total",
                                 metrics_source=src, window=window)  # fmt: skip
            queries = metric_series(conn, run_id, "vllm:external_prefix_cache_queries_total",
                                    metrics_source=src, window=window)  # fmt: skip
            if by_label or hits:
                out.append(
                    CacheSources(
                        src,
                        {k: counter_rate(v) for k, v in sorted(by_label.items())},
                        ratio_of_rates(hits, queries),
                    )
                )
    return out


QUEUE_METRIC = "kvscope:watch_queue_batches"
LAG_METRIC = "kvscope:watch_lag_seconds"
PRESSURE_SOURCE = -1  # the recorder's own samples (profiler.watch.recorder)


def back_pressure(
    source: Source, run_id: int, window: Window | None = None
) -> tuple[list[MetricPoint], list[MetricPoint]]:
    """The recorder's queue depth (batches) and lag (s) when they changed: empty
    when it always kept up."""
    return (
        metric_series(source, run_id, QUEUE_METRIC, metrics_source=PRESSURE_SOURCE, window=window),
        metric_series(source, run_id, LAG_METRIC, metrics_source=PRESSURE_SOURCE, window=window),
    )


@dataclass(frozen=True, slots=True)
class Incident:
    t_s: float
    source: int
    kind: str
    first_seq: int | None
    last_seq: int | None
    recovered: int
    lost: int
    detail: str | None


def incidents(
    source: Source, run_id: int, *, newest: int | None = None, window: Window | None = None
) -> list[Incident]:
    """Gaps, restarts, disconnects, bad messages and failed scrapes (of ``window``),
    in time order (only the ``newest`` ones when given: a flapping source makes
    thousands)."""
    limit = -1 if newest is None else int(newest)
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        rows = conn.execute(
            "SELECT * FROM (SELECT ts_ns, source, kind, first_seq, last_seq, recovered, lost, "
            "detail, rowid AS r FROM watch_incidents WHERE run_id = ? AND ts_ns BETWEEN ? AND ? "
            "ORDER BY ts_ns DESC, rowid DESC LIMIT ?) ORDER BY ts_ns, r",
            (run_id, *_ns(origin, window), limit),
        ).fetchall()
    return [Incident((row[0] - origin) / 1e9, *row[1:8]) for row in rows]


def raw_events(source: Source, run_id: int, limit: int = 1000) -> list[dict[str, Any]]:
    """Events or fields this kvscope did not know, as recorded."""
    with connection(source) as conn:
        rows = conn.execute(
            "SELECT source, seq, type, payload FROM watch_raw WHERE run_id = ? "
            "ORDER BY rowid LIMIT ?",
            (run_id, limit),
        ).fetchall()
    return [{"source": s, "seq": q, "type": t, "payload": p} for s, q, t, p in rows]
