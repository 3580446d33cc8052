"""What every watch view shows, kept up to date as the recorder writes.

A view of a watched fleet must cost what changed, not what happened: an hour of
a busy fleet is millions of block events, and replaying them on every refresh
took 8-80 s (issue 23). So ``WatchWriter`` feeds every block row it inserts
through ``FleetState``, which holds each source's cache in memory (copies per
(medium, group, hash), since ``BlockRemoved`` fires once per physical copy)
and the prefix tree, and writes what the views need into the tables below, in
the same transaction as the raw rows:

| table | one row per |
|---|---|
| ``watch_agg_state`` | run: the last ``watch_blocks`` rowid folded in |
| ``watch_source_stats`` | source: stored, new, removed, re-announced, recomputed after eviction, routing misses, clears, lifetimes |
| ``watch_live`` | (source, medium, group): blocks held and their copies |
| ``watch_series`` | (bucket width, bucket, source, medium): stored, removed, live at the bucket's end, recomputed, routing misses |
| ``watch_fleet_series`` | (bucket width, bucket, engine kind): blocks on >= 2 sources, extra copies (end, peak) |
| ``watch_fleet`` | engine kind: duplication now and at peak, prefix-tree node counts |
| ``watch_histograms`` | (source, histogram, bin): lifetime, idle before eviction, reuse gap, removal-to-restore |
| ``watch_shared_prefixes`` | the largest shared prefixes, ranked |

Media and groups are stored as ``''`` and ``-1`` when the engine sent none
(SQLite's primary keys treat NULLs as distinct). Series come in bucket widths
of 1 s, 1 min and 1 h, so a view of any window reads at most a few thousand
rows. The two misses a fleet operator pays for: a hash stored on a source
that had removed it (recomputation after eviction: more KV memory would have
saved it) and a hash stored on one source while another source of the same
engine kind holds it (a routing miss: a KV-aware router would have hit it).
"""

from __future__ import annotations

import heapq
import json
import math
import sqlite3
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Sequence

from db.watch_schema import OP_CLEARED, OP_REMOVED, OP_RESET, OP_STORED

BUCKET_WIDTHS_S = (1, 60, 3600)
# Hashes removed from a source remembered to recognise one stored again
# (recomputation); an OrderedDict trims its oldest in O(1).
EVICTED_MEMORY = 1_000_000
TOP_PREFIXES = 20
PREFIX_REFRESH_S = 2.0  # the ranking of shared prefixes is refreshed at most this often
# Histograms: four bins per octave of milliseconds; bin 0 is under 1 ms.
HISTOGRAMS = ("lifetime", "idle_before_evict", "reuse_gap", "restore_gap")
BINS_PER_OCTAVE = 4
NO_MEDIUM = ""
NO_GROUP = -1

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


def bin_of(seconds: float) -> int:
    ms = seconds * 1000.0
    return 0 if ms < 1.0 else 1 + int(BINS_PER_OCTAVE * math.log2(ms))


def bin_edges_s(b: int) -> tuple[float, float]:
    """A bin's [low, high) in seconds."""
    if b <= 0:
        return 0.0, 0.001
    return 2 ** ((b - 1) / BINS_PER_OCTAVE) / 1000.0, 2 ** (b / BINS_PER_OCTAVE) / 1000.0


class _Source:
    """One source's cache as the stream tells it."""

    __slots__ = (
        "bit",
        "engine",
        "held",
        "on_source",
        "evicted",
        "live",
        "stats",
        "hist",
    )

    def __init__(self, index: int, engine: str) -> None:
        self.bit = 1 << index
        self.engine = engine
        self.held: dict[tuple, list[int]] = {}  # (medium, group, hash) -> [copies, stored, last]
        self.on_source: dict[int, int] = {}  # hash -> (medium, group) keys holding it
        self.evicted: OrderedDict[int, int] = OrderedDict()  # hash -> removed at (ns)
        self.live: dict[tuple[str, int], list[int]] = {}  # (medium, group) -> [blocks, copies]
        self.stats = dict.fromkeys(STAT_COLUMNS, 0)
        self.stats["lifetime_sum_s"] = 0.0
        self.hist: dict[tuple[str, int], int] = defaultdict(int)  # deltas since the last persist


class _Tree:
    """The prefix tree of one engine kind: every block ever stored, by its parent."""

    __slots__ = ("nodes", "branch_points", "roots", "max_depth")

    def __init__(self) -> None:
        # hash -> [parent, depth, children, subtree size, sources that stored it (bits)]
        self.nodes: dict[int, list] = {}
        self.branch_points: set[int] = set()
        self.roots = 0
        self.max_depth = 0


class FleetState:
    """Every source's cache, the fleet's holders and the prefix trees of one run."""

    def __init__(self, run_id: int, origin_ns: int) -> None:
        self.run_id = run_id
        self.origin_ns = origin_ns
        self.sources: dict[int, _Source] = {}
        self.holders: dict[tuple[str, int], int] = {}  # (engine, hash) -> source bits
        self.duplicated: dict[str, int] = defaultdict(int)
        self.extra: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self.trees: dict[str, _Tree] = defaultdict(_Tree)
        self.applied_rowid = 0
        # deltas since the last persist: (width, bucket, source, medium) -> [stored,
        # removed, live, recomputed, routing]; live is the value at the last event
        self._series: dict[tuple, list[int]] = {}
        self._fleet_series: dict[
            tuple, list[int]
        ] = {}  # (width, bucket, engine) -> [dup, extra, peak]
        self._prefixes_at = 0.0
        self._prefixes_dirty = False

    # --- feeding ----------------------------------------------------------------------

    def add_source(self, index: int, engine: str | None) -> None:
        if index not in self.sources:
            self.sources[index] = _Source(index, engine or "")

    def _source(self, index: int) -> _Source:
        src = self.sources.get(index)
        if src is None:
            src = self.sources[index] = _Source(index, "")
        return src

    def apply(
        self, rows: Sequence[tuple], hash_lists: Sequence[list[int] | None] | None = None
    ) -> None:
        """Fold ``watch_blocks`` rows (``BLOCK_COLUMNS`` order, without run_id) in,
        in arrival order; ``hash_lists`` spares parsing the JSON again."""
        for i, row in enumerate(rows):
            source, _seq, ts_ns, op, text, parent, medium, group, _n = row
            hashes = hash_lists[i] if hash_lists is not None else None
            if hashes is None and text:
                hashes = json.loads(text)
            src = self._source(source)
            if op == OP_STORED:
                self._store(src, source, ts_ns, hashes or (), parent, medium, group)
            elif op == OP_REMOVED:
                self._remove(src, source, ts_ns, hashes or (), medium, group)
            elif op in (OP_CLEARED, OP_RESET):
                self._clear(src, source, ts_ns, op)

    def _buckets(self, ts_ns: int) -> list[tuple[int, int]]:
        rel = ts_ns - self.origin_ns
        return [(w, rel // (w * 1_000_000_000)) for w in BUCKET_WIDTHS_S]

    def _note_series(self, source: int, medium: str, ts_ns: int, stored: int, removed: int,
                     recomputed: int, routing: int, live: int) -> None:  # fmt: skip
        series = self._series
        for w, b in self._buckets(ts_ns):
            key = (w, b, source, medium)
            entry = series.get(key)
            if entry is None:
                series[key] = [stored, removed, live, recomputed, routing]
            else:
                entry[0] += stored
                entry[1] += removed
                entry[2] = live
                entry[3] += recomputed
                entry[4] += routing

    def _note_fleet(self, engine: str, ts_ns: int) -> None:
        dup, extra = self.duplicated[engine], self.extra[engine]
        fleet = self._fleet_series
        for w, b in self._buckets(ts_ns):
            key = (w, b, engine)
            entry = fleet.get(key)
            if entry is None:
                fleet[key] = [dup, extra, extra]
            else:
                entry[0] = dup
                entry[1] = extra
                if extra > entry[2]:
                    entry[2] = extra

    def _hold(self, engine: str, block: int, bit: int, add: bool) -> None:
        key = (engine, block)
        mask = self.holders.get(key, 0)
        before = mask.bit_count()
        mask = mask | bit if add else mask & ~bit
        after = mask.bit_count()
        if mask:
            self.holders[key] = mask
        else:
            self.holders.pop(key, None)
        if after != before:
            self.extra[engine] += max(after - 1, 0) - max(before - 1, 0)
            if self.extra[engine] > self.peak[engine]:
                self.peak[engine] = self.extra[engine]
            self.duplicated[engine] += (after >= 2) - (before >= 2)

    def _store(self, src: _Source, source: int, ts_ns: int, hashes: Iterable[int],
               parent: int | None, medium: str | None, group: int | None) -> None:  # fmt: skip
        m = NO_MEDIUM if medium is None else medium
        g = NO_GROUP if group is None else group
        held, on_source, stats, hist = src.held, src.on_source, src.stats, src.hist
        live = src.live.get((m, g))
        if live is None:
            live = src.live[(m, g)] = [0, 0]
        engine, bit = src.engine, src.bit
        holders = self.holders
        stored = recomputed = routing = 0
        for block in hashes:
            stored += 1
            key = (m, g, block)
            entry = held.get(key)
            if entry is not None:
                entry[0] += 1
                live[1] += 1
                stats["reannounced"] += 1
                hist[("reuse_gap", bin_of((ts_ns - entry[2]) / 1e9))] += 1
                entry[2] = ts_ns
                continue
            held[key] = [1, ts_ns, ts_ns]
            live[0] += 1
            live[1] += 1
            n = on_source.get(block, 0)
            on_source[block] = n + 1
            if n:
                continue
            stats["new_blocks"] += 1
            removed_at = src.evicted.pop(block, None)
            others = holders.get((engine, block), 0) & ~bit
            if removed_at is not None:
                recomputed += 1
                hist[("restore_gap", bin_of((ts_ns - removed_at) / 1e9))] += 1
            if others:
                routing += 1
                if removed_at is not None:
                    stats["both_misses"] += 1
            self._hold(engine, block, bit, True)
        stats["stored"] += stored
        stats["recomputed"] += recomputed
        stats["routing_misses"] += routing
        self._grow_tree(engine, bit, hashes, parent)
        self._note_series(
            source, m, ts_ns, stored, 0, recomputed, routing, self._live_blocks(src, m)
        )
        self._note_fleet(engine, ts_ns)

    def _remove(self, src: _Source, source: int, ts_ns: int, hashes: Iterable[int],
                medium: str | None, group: int | None) -> None:  # fmt: skip
        m = NO_MEDIUM if medium is None else medium
        g = NO_GROUP if group is None else group
        held, on_source, stats, hist = src.held, src.on_source, src.stats, src.hist
        evicted = src.evicted
        live = src.live.get((m, g))
        if live is None:
            live = src.live[(m, g)] = [0, 0]
        removed = 0
        for block in hashes:
            removed += 1
            key = (m, g, block)
            entry = held.get(key)
            if entry is None:
                stats["removed_unknown"] += 1
                if block not in on_source:
                    evicted[block] = ts_ns
                    evicted.move_to_end(block)
                    if len(evicted) > EVICTED_MEMORY:
                        evicted.popitem(last=False)
                continue
            live[1] -= 1
            entry[0] -= 1
            if entry[0] > 0:
                continue  # another physical copy still holds it
            del held[key]
            live[0] -= 1
            life_s = (ts_ns - entry[1]) / 1e9
            stats["lifetime_count"] += 1
            stats["lifetime_sum_s"] += life_s
            hist[("lifetime", bin_of(life_s))] += 1
            hist[("idle_before_evict", bin_of((ts_ns - entry[2]) / 1e9))] += 1
            n = on_source[block] - 1
            if n:
                on_source[block] = n
                continue
            del on_source[block]
            evicted[block] = ts_ns
            if len(evicted) > EVICTED_MEMORY:
                evicted.popitem(last=False)
            self._hold(src.engine, block, src.bit, False)
        stats["removed"] += removed
        self._note_series(source, m, ts_ns, 0, removed, 0, 0, self._live_blocks(src, m))
        self._note_fleet(src.engine, ts_ns)

    def _clear(self, src: _Source, source: int, ts_ns: int, op: int) -> None:
        src.stats["clears" if op == OP_CLEARED else "resets"] += 1
        for block in src.on_source:
            self._hold(src.engine, block, src.bit, False)
        src.held.clear()
        src.on_source.clear()
        src.evicted.clear()  # a reset is not a capacity miss: what follows is a fresh cache
        media = {m for m, _ in src.live}
        for counts in src.live.values():
            counts[0] = counts[1] = 0  # kept at 0 so a chart's line drops to 0
        for m in media:
            self._note_series(source, m, ts_ns, 0, 0, 0, 0, 0)
        self._note_fleet(src.engine, ts_ns)

    @staticmethod
    def _live_blocks(src: _Source, medium: str) -> int:
        return sum(c[0] for (m, _), c in src.live.items() if m == medium)

    def _grow_tree(self, engine: str, bit: int, hashes: Iterable[int], parent: int | None) -> None:
        """Add a parent-chained run of blocks; subtree sizes grow along the chain and
        once up the ancestors (per event, not per block)."""
        tree = self.trees[engine]
        nodes = tree.nodes
        chain = []
        par = parent
        for block in hashes:
            node = nodes.get(block)
            if node is None:
                above = nodes.get(par) if par is not None and par != block else None
                depth = above[1] + 1 if above is not None else 1
                node = nodes[block] = [par, depth, 0, 0, bit]
                if above is not None:
                    above[2] += 1
                    if above[2] == 2:
                        tree.branch_points.add(par)
                else:
                    tree.roots += 1
                if depth > tree.max_depth:
                    tree.max_depth = depth
                chain.append((node, True))
            else:
                node[4] |= bit
                chain.append((node, False))
            par = block
        added = 0
        for node, new in reversed(chain):
            node[3] += added + new
            added += new
        if not added or not chain:
            return
        self._prefixes_dirty = True
        first = chain[0][0]
        up = first[0]
        steps = 0
        seen_limit = len(nodes)
        while up is not None and steps <= seen_limit:
            node = nodes.get(up)
            if node is None:
                break
            node[3] += added
            up = node[0]
            steps += 1

    # --- what the views read -------------------------------------------------------------

    def top_prefixes(self, top: int = TOP_PREFIXES) -> list[tuple]:
        """(engine, hash, depth, branches, subtree, sources bits), largest first."""
        out = []
        for engine, tree in self.trees.items():
            nodes = tree.nodes
            best = heapq.nlargest(
                top,
                tree.branch_points,
                key=lambda h: (nodes[h][1] * (nodes[h][2] - 1), nodes[h][3]),
            )
            out += [(engine, h, nodes[h][1], nodes[h][2], nodes[h][3], nodes[h][4]) for h in best]
        out.sort(key=lambda p: (p[2] * (p[3] - 1), p[4]), reverse=True)
        return out[:top]

    def persist(self, conn: sqlite3.Connection, *, final: bool = False) -> None:
        """Write what changed since the last call (inside the caller's transaction)."""
        r = self.run_id
        stat_names = ", ".join(STAT_COLUMNS)
        conn.executemany(
            f"INSERT OR REPLACE INTO watch_source_stats (run_id, source, {stat_names}) "
            f"VALUES ({r}, ?, {', '.join('?' * len(STAT_COLUMNS))})",
            [(i, *(s.stats[c] for c in STAT_COLUMNS)) for i, s in self.sources.items()],
        )
        conn.executemany(
            f"INSERT OR REPLACE INTO watch_live VALUES ({r}, ?, ?, ?, ?, ?)",
            [
                (i, m, g, c[0], c[1])
                for i, s in self.sources.items()
                for (m, g), c in s.live.items()
            ],
        )
        if self._series:
            conn.executemany(
                f"INSERT INTO watch_series VALUES ({r}, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET stored = stored + excluded.stored, "
                "removed = removed + excluded.removed, live = excluded.live, "
                "recomputed = recomputed + excluded.recomputed, "
                "routing_misses = routing_misses + excluded.routing_misses",
                [(*k, *v) for k, v in self._series.items()],
            )
            self._series = {}
        if self._fleet_series:
            conn.executemany(
                f"INSERT INTO watch_fleet_series VALUES ({r}, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET duplicated = excluded.duplicated, "
                "extra_copies = excluded.extra_copies, "
                "peak_extra_copies = MAX(peak_extra_copies, excluded.peak_extra_copies)",
                [(*k, *v) for k, v in self._fleet_series.items()],
            )
            self._fleet_series = {}
        rows = []
        for i, s in self.sources.items():
            rows += [(i, name, b, n) for (name, b), n in s.hist.items()]
            s.hist.clear()
        if rows:
            conn.executemany(
                f"INSERT INTO watch_histograms VALUES ({r}, ?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET count = count + excluded.count",
                rows,
            )
        engines = {s.engine for s in self.sources.values()} | set(self.trees)
        conn.executemany(
            f"INSERT OR REPLACE INTO watch_fleet VALUES ({r}, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    e,
                    self.duplicated[e],
                    self.extra[e],
                    self.peak[e],
                    len(self.trees[e].nodes) if e in self.trees else 0,
                    self.trees[e].roots if e in self.trees else 0,
                    len(self.trees[e].branch_points) if e in self.trees else 0,
                    self.trees[e].max_depth if e in self.trees else 0,
                )
                for e in sorted(engines)
            ],
        )
        now = time.monotonic()
        if self._prefixes_dirty and (final or now - self._prefixes_at >= PREFIX_REFRESH_S):
            self._prefixes_at = now
            self._prefixes_dirty = False
            conn.execute("DELETE FROM watch_shared_prefixes WHERE run_id = ?", (r,))
            conn.executemany(
                f"INSERT INTO watch_shared_prefixes VALUES ({r}, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (rank, e, h, depth, branches, subtree, _bits(mask))
                    for rank, (e, h, depth, branches, subtree, mask) in enumerate(
                        self.top_prefixes()
                    )
                ],
            )
        conn.execute(
            "INSERT INTO watch_agg_state (run_id, applied_rowid) VALUES (?, ?) "
            "ON CONFLICT DO UPDATE SET applied_rowid = excluded.applied_rowid",
            (r, self.applied_rowid),
        )


def _bits(mask: int) -> str:
    return ",".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1)


def rebuild(conn: sqlite3.Connection, run_id: int, chunk: int = 50_000) -> FleetState:
    """A run's state folded from its raw rows (a database recorded before the
    aggregates existed, or a watch resumed on the same run)."""
    from db.source import run_origin

    state = FleetState(run_id, run_origin(conn, run_id))
    for index, engine in conn.execute(
        "SELECT source, engine FROM watch_sources WHERE run_id = ? AND kind = 'events'", (run_id,)
    ):
        state.add_source(index, engine)
    last = 0
    while True:
        rows = conn.execute(
            "SELECT rowid, source, seq, ts_ns, op, block_hashes, parent_hash, medium, group_idx, "
            "blocks FROM watch_blocks WHERE run_id = ? AND rowid > ? ORDER BY rowid LIMIT ?",
            (run_id, last, chunk),
        ).fetchall()
        if not rows:
            break
        last = rows[-1][0]
        state.apply([row[1:] for row in rows])
    state.applied_rowid = last
    for table in ("watch_series", "watch_fleet_series", "watch_histograms", "watch_live"):
        conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
    state.persist(conn, final=True)
    return state


def rebuild_all(conn: sqlite3.Connection) -> None:
    """Every watch run's aggregates from its raw rows (migration 6)."""
    runs = [r[0] for r in conn.execute("SELECT id FROM runs WHERE kind = 'watch' ORDER BY id")]
    for run_id in runs:
        rebuild(conn, run_id)
