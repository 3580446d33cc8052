"""Block figures from the aggregates (never the raw ``watch_blocks``): cached blocks
and copies by medium, lifetimes, re-announced blocks, recomputation after eviction and
routing misses, clears and restarts, duplication across replicas, the prefix tree's
largest shared prefixes. Hashes compare only within one engine kind, so every
cross-source figure groups by ``engine``."""

from __future__ import annotations

import math
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field, replace

from kvscope.db.source import Source, connection
from kvscope.db.watch_aggregates import (
    NO_MEDIUM,
    STAT_COLUMNS,
    bin_edges_s,
)
from kvscope.db.watch_read.sources import watch_sources
from kvscope.db.watch_read.windows import (
    Window,
    WindowCounts,
    _bucket_rows,
    window_counts,
    window_span_s,
)
from kvscope.db.watch_schema import table_columns


def _medium(value: str) -> str | None:
    return None if value == NO_MEDIUM else value


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


# What a view says where a window's prefill is unknown: buckets that schema v8's
# migration could not fill (their raw rows were trimmed by --keep-raw before it).
SHARES_UNKNOWN = "shares unknown for this window (recorded before v8)"


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
