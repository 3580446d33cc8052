"""The tables every watch view reads, and how a fold's changes are written to them.

A view of a watched fleet must cost what changed, not what happened: an hour of
a busy fleet is millions of block events. So the watch folds every block row it
inserts (``profiler.watch.fold``) and writes what the views need into the tables
below, in the same transaction as the raw rows:

| table | one row per |
|---|---|
| ``watch_agg_state`` | run: the last ``watch_blocks`` rowid folded in |
| ``watch_agg_stale`` | run whose aggregates a migration left to be folded again |
| ``watch_source_stats`` | source: stored, new, removed, re-announced, recomputed after eviction, routing misses, clears, lifetimes |
| ``watch_live`` | (source, medium, group): blocks held and their copies |
| ``watch_series`` | (bucket width, bucket, source, medium): stored, removed, live at the bucket's end, recomputed, routing misses, new (prefill) blocks, both misses at once (the last two NULL in buckets of runs whose raw rows were trimmed before they existed) |
| ``watch_fleet_series`` | (bucket width, bucket, engine kind): blocks on >= 2 sources, extra copies (end, peak) |
| ``watch_fleet`` | engine kind: duplication now and at peak, prefix-tree node counts |
| ``watch_histograms`` | (source, histogram, bin): lifetime, idle before eviction, reuse gap, removal-to-restore |
| ``watch_shared_prefixes`` | the largest shared prefixes, ranked |

This module is what the writer and the readers share: the tables, the names of
their columns and bins, and ``AggregateRows``, the rows a fold hands over to be
written. It knows nothing of how the fold computes them, and db/ never imports
the fold: a migration that changes what the aggregates hold only marks the runs
stale, and ``profiler.watch.fold.refold`` folds them again from their raw rows.

Media and groups are stored as ``''`` and ``0`` when the engine sent none
(SQLite's primary keys treat NULLs as distinct). Series come in bucket widths
of 1 s, 1 min and 1 h, so a view of any window reads at most a few thousand
rows.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field

BUCKET_WIDTHS_S = (1, 60, 3600)
TOP_PREFIXES = 20
# Histograms: four bins per octave of milliseconds; bin 0 is under 1 ms.
HISTOGRAMS = ("lifetime", "idle_before_evict", "reuse_gap", "restore_gap")
BINS_PER_OCTAVE = 4
NO_MEDIUM = ""
NO_GROUP = 0  # an engine that names no group has one: vLLM numbers it 0

STAT_COLUMNS = (
    "stored",  # block events stored (one per hash)
    "new_blocks",  # stored while the source held the hash on no medium: prefill paid
    "removed",
    "reannounced",  # stored while already held there: a hit re-announced, or a second copy
    "recomputed",  # new, and the source had removed it: recomputation after eviction
    "routing_misses",  # new, while another source of the engine kind held it
    "both_misses",  # new, recomputed and held elsewhere at once
    "removed_unknown",  # removed without a store seen (stored before the watch began)
    "clears",
    "resets",
    "lifetime_count",
    "lifetime_sum_s",
)


# watch_series' columns after run_id, in the order persist writes them; new_blocks and
# both_misses since schema v8 (add_prefill_series)
SERIES_COLUMNS = (
    "width_s, bucket, source, medium, stored, removed, live, recomputed, routing_misses, "
    "new_blocks, both_misses"
)


# watch_series' columns after run_id, in the order AggregateRows.series holds them
SERIES_COLUMNS = (
    "width_s, bucket, source, medium, stored, removed, live, recomputed, routing_misses, "
    "new_blocks, both_misses"
)


def create_aggregate_tables(db) -> None:
    """Schema version 6's tables (``db.migrations``); change only by a migration."""
    db.execute(
        "CREATE TABLE watch_agg_state (run_id INTEGER PRIMARY KEY REFERENCES runs(id), "
        "applied_rowid INTEGER NOT NULL, raw_trimmed_before INTEGER)"
    )
    stats = ", ".join(
        f"{c} {'REAL' if c.endswith('_s') else 'INTEGER'} NOT NULL DEFAULT 0" for c in STAT_COLUMNS
    )
    db.execute(
        f"CREATE TABLE watch_source_stats (run_id INTEGER, source INTEGER, {stats}, "
        "PRIMARY KEY (run_id, source))"
    )
    db.execute(
        "CREATE TABLE watch_live (run_id INTEGER, source INTEGER, medium TEXT, group_idx INTEGER, "
        "blocks INTEGER, copies INTEGER, PRIMARY KEY (run_id, source, medium, group_idx))"
    )
    db.execute(
        "CREATE TABLE watch_series (run_id INTEGER, width_s INTEGER, bucket INTEGER, "
        "source INTEGER, medium TEXT, stored INTEGER, removed INTEGER, live INTEGER, "
        "recomputed INTEGER, routing_misses INTEGER, "
        "PRIMARY KEY (run_id, width_s, bucket, source, medium))"
    )
    db.execute(
        "CREATE TABLE watch_fleet_series (run_id INTEGER, width_s INTEGER, bucket INTEGER, "
        "engine TEXT, duplicated INTEGER, extra_copies INTEGER, peak_extra_copies INTEGER, "
        "PRIMARY KEY (run_id, width_s, bucket, engine))"
    )
    db.execute(
        "CREATE TABLE watch_fleet (run_id INTEGER, engine TEXT, duplicated INTEGER, "
        "extra_copies INTEGER, peak_extra_copies INTEGER, tree_nodes INTEGER, tree_roots INTEGER, "
        "branch_points INTEGER, max_depth INTEGER, PRIMARY KEY (run_id, engine))"
    )
    db.execute(
        "CREATE TABLE watch_histograms (run_id INTEGER, source INTEGER, name TEXT, bin INTEGER, "
        "count INTEGER, PRIMARY KEY (run_id, source, name, bin))"
    )
    db.execute(
        "CREATE TABLE watch_shared_prefixes (run_id INTEGER, rank INTEGER, engine TEXT, "
        "block_hash INTEGER, depth_blocks INTEGER, branches INTEGER, subtree_blocks INTEGER, "
        "sources TEXT, PRIMARY KEY (run_id, rank))"
    )
    # Exports and audits read one run's raw events; views never do.
    db.execute("CREATE INDEX watch_blocks_run ON watch_blocks (run_id)")


def create_stale_table(db) -> None:
    """``watch_agg_stale``: runs to fold again (a migration's mark, cleared by the refold)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS watch_agg_stale (run_id INTEGER PRIMARY KEY REFERENCES runs(id))"
    )


def mark_stale(conn: sqlite3.Connection, *, untrimmed_only: bool = False) -> None:
    """Every watch run's aggregates to be folded again from its raw rows;
    ``untrimmed_only``: only runs that still hold all of them (no ``--keep-raw``
    trim: a trimmed run's state at the trim is gone, and what it has stays)."""
    sql = "INSERT OR IGNORE INTO watch_agg_stale SELECT id FROM runs WHERE kind = 'watch'"
    if untrimmed_only:
        sql += (
            " AND id NOT IN (SELECT run_id FROM watch_agg_state "
            "WHERE raw_trimmed_before IS NOT NULL)"
        )
    conn.execute(sql)


def stale_runs(conn: sqlite3.Connection) -> list[int]:
    """The runs whose aggregates wait for a refold, oldest first."""
    return [r for (r,) in conn.execute("SELECT run_id FROM watch_agg_stale ORDER BY run_id")]


def block_rows(conn: sqlite3.Connection, run_id: int, chunk: int = 50_000) -> Iterator[list[tuple]]:
    """A run's raw block rows in arrival order, ``chunk`` at a time: (rowid, then
    ``BLOCK_COLUMNS`` without run_id)."""
    last = 0
    while True:
        rows = conn.execute(
            "SELECT rowid, source, seq, ts_ns, op, block_hashes, parent_hash, medium, group_idx, "
            "blocks FROM watch_blocks WHERE run_id = ? AND rowid > ? ORDER BY rowid LIMIT ?",
            (run_id, last, chunk),
        ).fetchall()
        if not rows:
            return
        last = rows[-1][0]
        yield rows


AGGREGATE_TABLES = (
    "watch_source_stats",
    "watch_live",
    "watch_series",
    "watch_fleet_series",
    "watch_fleet",
    "watch_histograms",
    "watch_shared_prefixes",
)


def clear_aggregates(conn: sqlite3.Connection, run_id: int) -> None:
    """A run's aggregates gone, before they are written again from a refold."""
    for table in AGGREGATE_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
    conn.execute("DELETE FROM watch_agg_stale WHERE run_id = ?", (run_id,))


def bin_of(seconds: float) -> int:
    ms = seconds * 1000.0
    return 0 if ms < 1.0 else 1 + int(BINS_PER_OCTAVE * math.log2(ms))


def bin_edges_s(b: int) -> tuple[float, float]:
    """A bin's [low, high) in seconds."""
    if b <= 0:
        return 0.0, 0.001
    return 2 ** ((b - 1) / BINS_PER_OCTAVE) / 1000.0, 2 ** (b / BINS_PER_OCTAVE) / 1000.0


@dataclass(slots=True)
class AggregateRows:
    """What changed in one run's aggregates since the last write, as rows of the
    tables above without their run_id (a fold makes them; ``write_aggregates``
    writes them). Stats, live blocks and the fleet's figures are totals (replaced);
    series and histograms are deltas (added)."""

    applied_rowid: int
    stats: list[tuple] = field(default_factory=list)  # source, *STAT_COLUMNS, forgotten
    live: list[tuple] = field(default_factory=list)  # source, medium, group, blocks, copies
    series: list[tuple] = field(default_factory=list)  # SERIES_COLUMNS
    fleet_series: list[tuple] = field(
        default_factory=list
    )  # width, bucket, engine, dup, extra, peak
    histograms: list[tuple] = field(default_factory=list)  # source, name, bin, count
    fleet: list[tuple] = field(default_factory=list)  # watch_fleet's columns
    # (rank, engine, hash, depth, branches, subtree, sources), or None: unchanged
    shared_prefixes: list[tuple] | None = None


_STAT_NAMES = ", ".join(STAT_COLUMNS) + ", forgotten_removals"


def write_aggregates(conn: sqlite3.Connection, run_id: int, rows: AggregateRows) -> None:
    """Write a fold's changes (inside the caller's transaction)."""
    r = int(run_id)
    conn.executemany(
        f"INSERT OR REPLACE INTO watch_source_stats (run_id, source, {_STAT_NAMES}) "
        f"VALUES ({r}, ?, {', '.join('?' * (len(STAT_COLUMNS) + 1))})",
        rows.stats,
    )
    conn.executemany(f"INSERT OR REPLACE INTO watch_live VALUES ({r}, ?, ?, ?, ?, ?)", rows.live)
    if rows.series:
        conn.executemany(
            f"INSERT INTO watch_series (run_id, {SERIES_COLUMNS}) VALUES ({r}, "
            f"{', '.join('?' * 11)}) ON CONFLICT DO UPDATE SET stored = stored + excluded.stored, "
            "removed = removed + excluded.removed, live = excluded.live, "
            "recomputed = recomputed + excluded.recomputed, "
            "routing_misses = routing_misses + excluded.routing_misses, "
            # NULL (a bucket of a trimmed run recorded before the column) stays unknown
            "new_blocks = new_blocks + excluded.new_blocks, "
            "both_misses = both_misses + excluded.both_misses",
            rows.series,
        )
    if rows.fleet_series:
        conn.executemany(
            f"INSERT INTO watch_fleet_series VALUES ({r}, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT DO UPDATE SET duplicated = excluded.duplicated, "
            "extra_copies = excluded.extra_copies, "
            "peak_extra_copies = MAX(peak_extra_copies, excluded.peak_extra_copies)",
            rows.fleet_series,
        )
    if rows.histograms:
        conn.executemany(
            f"INSERT INTO watch_histograms VALUES ({r}, ?, ?, ?, ?) "
            "ON CONFLICT DO UPDATE SET count = count + excluded.count",
            rows.histograms,
        )
    conn.executemany(
        f"INSERT OR REPLACE INTO watch_fleet VALUES ({r}, ?, ?, ?, ?, ?, ?, ?, ?)", rows.fleet
    )
    if rows.shared_prefixes is not None:
        conn.execute("DELETE FROM watch_shared_prefixes WHERE run_id = ?", (r,))
        conn.executemany(
            f"INSERT INTO watch_shared_prefixes VALUES ({r}, ?, ?, ?, ?, ?, ?, ?)",
            rows.shared_prefixes,
        )
    conn.execute(
        "INSERT INTO watch_agg_state (run_id, applied_rowid) VALUES (?, ?) "
        "ON CONFLICT DO UPDATE SET applied_rowid = excluded.applied_rowid",
        (r, rows.applied_rowid),
    )


def add_prefill_columns(db) -> None:
    """Schema v8: per-bucket new (prefill) blocks and both-at-once misses in
    ``watch_series``, so a window's shares of prefill are the window's. Runs whose
    raw rows are all there are marked to be folded again to fill them; buckets
    of runs trimmed by ``--keep-raw`` stay NULL (their state at the trim is gone):
    the views say the shares are unknown there."""
    db.execute("ALTER TABLE watch_series ADD COLUMN new_blocks INTEGER")
    db.execute("ALTER TABLE watch_series ADD COLUMN both_misses INTEGER")
    create_stale_table(db)
    mark_stale(db.conn, untrimmed_only=True)


def add_forgotten_removals(db) -> None:
    """Schema v9: ``watch_source_stats.forgotten_removals``, the removals a source's
    memory of removed hashes let go of under the fold's fleet-wide bound (a
    re-store of one of those counts as new prefill, not as recomputation). Runs
    recorded before say 0: their per-source bound was not counted."""
    db.execute(
        "ALTER TABLE watch_source_stats ADD COLUMN forgotten_removals INTEGER NOT NULL DEFAULT 0"
    )
