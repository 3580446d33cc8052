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
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from db.watch_schema import OP_CLEARED, OP_REMOVED, OP_RESET, OP_STORED

BUCKET_WIDTHS_S = (1, 60, 3600)
# Hashes removed from a source remembered to recognise one stored again
# (recomputation); an OrderedDict trims its oldest in O(1).
EVICTED_MEMORY = 1_000_000
TOP_PREFIXES = 20
# The prefix tree keeps every block ever stored up to this many; past it, the
# oldest leaves no source holds any more are forgotten (counts above them stay).
MAX_TREE_NODES = 2_000_000
PREFIX_REFRESH_S = 2.0  # the ranking of shared prefixes is refreshed at most this often
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

    __slots__ = ("bit", "engine", "tree", "shelves", "on_source", "evicted", "copies", "stats",
                 "hist")  # fmt: skip

    def __init__(self, index: int, engine: str, tree: _Tree) -> None:
        self.bit = 1 << index
        self.engine = engine
        self.tree = tree
        # (medium, group) -> hash -> [copies, stored at, last stored at] (ns)
        self.shelves: dict[tuple[str, int], dict[int, list[int]]] = {}
        # hash -> shelves holding it; kept only once a source has two shelves (an
        # offload tier, hybrid groups): with one, held there is held on the source.
        self.on_source: dict[int, int] | None = None
        self.evicted: OrderedDict[int, int] = OrderedDict()  # hash -> removed at (ns)
        self.copies: dict[tuple[str, int], int] = {}  # (medium, group) -> physical copies
        self.stats = dict.fromkeys(STAT_COLUMNS, 0)
        self.stats["lifetime_sum_s"] = 0.0
        # durations (ns) per histogram since the last persist, binned then (numpy)
        self.hist: dict[str, list[int]] = {name: [] for name in HISTOGRAMS}

    def shelf(self, medium: str, group: int) -> dict[int, list[int]]:
        key = (medium, group)
        shelf = self.shelves.get(key)
        if shelf is None:
            if len(self.shelves) == 1 and self.on_source is None:
                (only,) = self.shelves.values()
                self.on_source = dict.fromkeys(only, 1)
            shelf = self.shelves[key] = {}
            self.copies[key] = 0
        return shelf

    def held_blocks(self, medium: str) -> int:
        if len(self.shelves) == 1:
            (((m, _), shelf),) = self.shelves.items()
            return len(shelf) if m == medium else 0
        return sum(len(s) for (m, _), s in self.shelves.items() if m == medium)

    def all_held(self) -> set[int] | dict[int, int]:
        if self.on_source is not None:
            return self.on_source
        return next(iter(self.shelves.values()), {})


class _Tree:
    """The prefix tree of one engine kind: every block ever stored, by its parent,
    and which sources hold each block now (the fleet's duplication)."""

    __slots__ = ("nodes", "branch_points", "roots", "max_depth", "duplicated", "extra", "peak")

    def __init__(self) -> None:
        # hash -> [parent, depth, children, subtree size, sources that stored it (bits),
        #          sources that hold it now (bits)]
        self.nodes: dict[int, list] = {}
        self.branch_points: set[int] = set()
        self.roots = 0
        self.max_depth = 0
        self.duplicated = 0  # hashes held by >= 2 sources now
        self.extra = 0  # copies beyond the first, across sources
        self.peak = 0


class FleetState:
    """Every source's cache, the fleet's holders and the prefix trees of one run."""

    def __init__(self, run_id: int, origin_ns: int) -> None:
        self.run_id = run_id
        self.origin_ns = origin_ns
        self.sources: dict[int, _Source] = {}
        self.trees: dict[str, _Tree] = {}
        self.applied_rowid = 0
        # deltas since the last persist: (width, bucket, source, medium) -> [stored,
        # removed, live, recomputed, routing]; live is the value at the last event
        self._series: dict[tuple, list[int]] = {}
        self._fleet_series: dict[
            tuple, list[int]
        ] = {}  # (width, bucket, engine) -> [dup, extra, peak]
        self._prefixes_at = 0.0
        self._prefixes_dirty = False
        # (source, medium) -> _note_entries' last answer; reset with the dicts above
        self._note_at: dict[tuple, tuple] = {}

    # --- feeding ----------------------------------------------------------------------

    def _tree(self, engine: str) -> _Tree:
        tree = self.trees.get(engine)
        if tree is None:
            tree = self.trees[engine] = _Tree()
        return tree

    def add_source(self, index: int, engine: str | None) -> None:
        src = self.sources.get(index)
        if src is None:
            self.sources[index] = _Source(index, engine or "", self._tree(engine or ""))
        elif engine and src.engine != engine and not src.shelves:
            src.engine, src.tree = engine, self._tree(engine)

    def _source(self, index: int) -> _Source:
        src = self.sources.get(index)
        if src is None:
            self.add_source(index, "")
            src = self.sources[index]
        return src

    def apply(
        self, rows: Sequence[tuple], hash_lists: Sequence[list[int] | None] | None = None
    ) -> None:
        """Fold ``watch_blocks`` rows (``BLOCK_COLUMNS`` order, without run_id) in,
        in arrival order; ``hash_lists`` spares parsing the JSON again."""
        sources = self.sources
        store, remove = self._store, self._remove
        if hash_lists is None:
            hash_lists = [None] * len(rows)
        for row, hashes in zip(rows, hash_lists, strict=True):
            source, _seq, ts_ns, op, text, parent, medium, group, _n = row
            if hashes is None and text:
                hashes = json.loads(text)
            src = sources.get(source)
            if src is None:
                src = self._source(source)
            if op == OP_STORED:
                store(src, source, ts_ns, hashes or (), parent, medium, group)
            elif op == OP_REMOVED:
                remove(src, source, ts_ns, hashes or (), medium, group)
            elif op in (OP_CLEARED, OP_RESET):
                self._clear(src, source, ts_ns, op)

    def _note(self, src: _Source, source: int, medium: str, ts_ns: int, stored: int,
              removed: int, recomputed: int, routing: int, live: int | None = None) -> None:  # fmt: skip
        if live is None:
            live = src.held_blocks(medium)
        tree = src.tree
        dup, extra = tree.duplicated, tree.extra
        rel = ts_ns - self.origin_ns
        # Consecutive events of a source mostly fall in the same second, hence in the
        # same bucket of every (wider, multiple) width: their entries are kept at hand
        # (until persist starts new dicts) instead of looked up per width and event.
        # Unrolled over the three widths: this runs once per event at fleet rates.
        cached = self._note_at.get((source, medium))
        if cached is None or cached[0] != rel // 1_000_000_000:
            cached = self._note_entries(src, source, medium, rel)
        _, s1, s2, s3, f1, f2, f3 = cached
        if stored:
            s1[0] += stored
            s2[0] += stored
            s3[0] += stored
        if removed:
            s1[1] += removed
            s2[1] += removed
            s3[1] += removed
        s1[2] = s2[2] = s3[2] = live
        if recomputed:
            s1[3] += recomputed
            s2[3] += recomputed
            s3[3] += recomputed
        if routing:
            s1[4] += routing
            s2[4] += routing
            s3[4] += routing
        f1[0] = f2[0] = f3[0] = dup
        f1[1] = f2[1] = f3[1] = extra
        if extra > f1[2]:
            f1[2] = extra
        if extra > f2[2]:
            f2[2] = extra
        if extra > f3[2]:
            f3[2] = extra

    def _note_entries(self, src: _Source, source: int, medium: str, rel: int) -> tuple:
        """(1 s bucket, the series entries, the fleet entries) of ``rel`` in each width, made
        (zero series counts, fleet counts set by the caller) where missing."""
        series, fleet = self._series, self._fleet_series
        mine, fleets = [], []
        for w in BUCKET_WIDTHS_S:
            b = rel // (w * 1_000_000_000)
            entry = series.get((w, b, source, medium))
            if entry is None:
                entry = series[(w, b, source, medium)] = [0, 0, 0, 0, 0]
            mine.append(entry)
            entry = fleet.get((w, b, src.engine))
            if entry is None:
                # peak starts at the first value, as a fresh entry did before
                tree = src.tree
                entry = fleet[(w, b, src.engine)] = [tree.duplicated, tree.extra, tree.extra]
            fleets.append(entry)
        cached = self._note_at[(source, medium)] = (rel // 1_000_000_000, *mine, *fleets)
        return cached

    def _store(self, src: _Source, source: int, ts_ns: int, hashes: Sequence[int],
               parent: int | None, medium: str | None, group: int | None) -> None:  # fmt: skip
        m = NO_MEDIUM if medium is None else medium
        g = NO_GROUP if group is None else group
        shelf = src.shelves.get((m, g))
        if shelf is None:
            shelf = src.shelf(m, g)
        on_source, stats, hist, evicted = src.on_source, src.stats, src.hist, src.evicted
        reuse, restore = hist["reuse_gap"], hist["restore_gap"]
        tree, bit = src.tree, src.bit
        nodes = tree.nodes
        # Every hash is a block event stored and a copy on the shelf: counted once.
        stored = copies = len(hashes)
        recomputed = routing = both = new = created = reannounced = 0
        chain = []
        par = parent
        for block in hashes:
            # the prefix tree: every block ever stored, chained to its parent
            node = nodes.get(block)
            if node is None:
                above = nodes.get(par) if par is not None and par != block else None
                if above is not None:
                    depth = above[1] + 1
                    above[2] += 1
                    if above[2] == 2:
                        tree.branch_points.add(par)
                else:
                    depth = 1
                    tree.roots += 1
                if depth > tree.max_depth:
                    tree.max_depth = depth
                node = nodes[block] = [par, depth, 0, 0, bit, 0]  # subtree 0: new
                created += 1
            else:
                node[4] |= bit
            chain.append(node)
            par = block
            # the source's cache: copies per (medium, group, hash)
            entry = shelf.get(block)
            if entry is not None:
                entry[0] += 1
                reannounced += 1
                reuse.append(ts_ns - entry[2])
                entry[2] = ts_ns
                continue
            shelf[block] = [1, ts_ns, ts_ns]
            if on_source is not None:
                n = on_source.get(block, 0)
                on_source[block] = n + 1
                if n:
                    continue  # on another medium or group of this source already
            new += 1
            removed_at = evicted.pop(block, None) if evicted else None
            mask = node[5] & ~bit
            if removed_at is not None:
                recomputed += 1
                restore.append(ts_ns - removed_at)
            if mask:
                routing += 1  # another source of this engine kind holds it
                if removed_at is not None:
                    both += 1
                tree.extra += 1
                if mask & (mask - 1) == 0:
                    tree.duplicated += 1
            node[5] = mask | bit
        if tree.extra > tree.peak:
            tree.peak = tree.extra
        src.copies[(m, g)] += copies
        stats["stored"] += stored
        stats["reannounced"] += reannounced
        stats["new_blocks"] += new
        stats["recomputed"] += recomputed
        stats["routing_misses"] += routing
        stats["both_misses"] += both
        added = 0
        # Only nodes made by this call have a subtree of 0: with none, nothing to add.
        for node in reversed(chain) if created else ():
            fresh = node[3] == 0
            node[3] += added + fresh
            added += fresh
        if added:
            self._prefixes_dirty = True
            up = chain[0][0]
            steps, limit = 0, len(nodes)
            while up is not None and steps <= limit:  # the limit: a cycle of hashes stops
                node = nodes.get(up)
                if node is None:
                    break
                node[3] += added
                up = node[0]
                steps += 1
        # one shelf (the usual source): it is what the source holds on its medium
        live = len(shelf) if len(src.shelves) == 1 else None
        self._note(src, source, m, ts_ns, stored, 0, recomputed, routing, live)

    def _release(self, tree: _Tree, block: int, bit: int) -> None:
        """``block`` no longer held by the source of ``bit``."""
        node = tree.nodes.get(block)
        if node is None:
            return
        mask = node[5]
        if not mask & bit:
            return
        mask &= ~bit
        node[5] = mask
        if mask:
            tree.extra -= 1
            if mask & (mask - 1) == 0:
                tree.duplicated -= 1

    def _remove(self, src: _Source, source: int, ts_ns: int, hashes: Sequence[int],
                medium: str | None, group: int | None) -> None:  # fmt: skip
        m = NO_MEDIUM if medium is None else medium
        g = NO_GROUP if group is None else group
        shelf = src.shelves.get((m, g))
        if shelf is None:
            shelf = src.shelf(m, g)
        on_source, stats, evicted = src.on_source, src.stats, src.evicted
        lifetimes, idle = src.hist["lifetime"], src.hist["idle_before_evict"]
        nodes = src.tree.nodes
        tree, bit = src.tree, src.bit
        removed = len(hashes)  # a block event per hash, known or not
        copies = life_ns = unknown = 0
        lives = len(lifetimes)
        for block in hashes:
            entry = shelf.get(block)
            if entry is None:
                unknown += 1
                if on_source is None or block not in on_source:
                    evicted[block] = ts_ns
                    evicted.move_to_end(block)
                    if len(evicted) > EVICTED_MEMORY:
                        evicted.popitem(last=False)
                continue
            copies += 1
            entry[0] -= 1
            if entry[0] > 0:
                continue  # another physical copy still holds it
            del shelf[block]
            life = ts_ns - entry[1]
            life_ns += life
            lifetimes.append(life)
            idle.append(ts_ns - entry[2])
            if on_source is not None:
                n = on_source[block] - 1
                if n:
                    on_source[block] = n
                    continue
                del on_source[block]
            evicted[block] = ts_ns
            if len(evicted) > EVICTED_MEMORY:
                evicted.popitem(last=False)
            node = nodes.get(block)  # the fleet: this source no longer holds it
            if node is not None and node[5] & bit:
                mask = node[5] & ~bit
                node[5] = mask
                if mask:
                    tree.extra -= 1
                    if mask & (mask - 1) == 0:
                        tree.duplicated -= 1
        src.copies[(m, g)] -= copies
        stats["removed"] += removed
        stats["removed_unknown"] += unknown
        stats["lifetime_count"] += len(lifetimes) - lives
        stats["lifetime_sum_s"] += life_ns / 1e9
        live = len(shelf) if len(src.shelves) == 1 else None
        self._note(src, source, m, ts_ns, 0, removed, 0, 0, live)

    def _clear(self, src: _Source, source: int, ts_ns: int, op: int) -> None:
        src.stats["clears" if op == OP_CLEARED else "resets"] += 1
        tree, bit = src.tree, src.bit
        for block in src.all_held():
            self._release(tree, block, bit)
        for shelf in src.shelves.values():
            shelf.clear()
        if src.on_source is not None:
            src.on_source.clear()
        src.evicted.clear()  # a reset is not a capacity miss: what follows is a fresh cache
        for key in src.copies:
            src.copies[key] = 0  # kept at 0 so a chart's line drops to 0
        for m in {m for m, _ in src.shelves}:
            self._note(src, source, m, ts_ns, 0, 0, 0, 0)

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
        self._note_at = {}  # its entries belong to the dicts written and replaced below
        for tree in self.trees.values():
            if len(tree.nodes) > MAX_TREE_NODES:
                _prune(tree, len(tree.nodes) - MAX_TREE_NODES * 9 // 10)
        stat_names = ", ".join(STAT_COLUMNS)
        conn.executemany(
            f"INSERT OR REPLACE INTO watch_source_stats (run_id, source, {stat_names}) "
            f"VALUES ({r}, ?, {', '.join('?' * len(STAT_COLUMNS))})",
            [(i, *(s.stats[c] for c in STAT_COLUMNS)) for i, s in self.sources.items()],
        )
        conn.executemany(
            f"INSERT OR REPLACE INTO watch_live VALUES ({r}, ?, ?, ?, ?, ?)",
            [
                (i, m, g, len(shelf), s.copies[(m, g)])
                for i, s in self.sources.items()
                for (m, g), shelf in s.shelves.items()
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
            for name, durations in s.hist.items():
                if durations:
                    rows += _binned(i, name, durations)
                    durations.clear()
        if rows:
            conn.executemany(
                f"INSERT INTO watch_histograms VALUES ({r}, ?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET count = count + excluded.count",
                rows,
            )
        conn.executemany(
            f"INSERT OR REPLACE INTO watch_fleet VALUES ({r}, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    e,
                    t.duplicated,
                    t.extra,
                    t.peak,
                    len(t.nodes),
                    t.roots,
                    len(t.branch_points),
                    t.max_depth,
                )  # fmt: skip
                for e, t in sorted(self.trees.items())
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


def _prune(tree: _Tree, count: int) -> None:
    """Forget up to ``count`` of the oldest leaves that no source holds: a week-long
    watch's tree stays bounded; the figures above them (children seen, blocks
    stored under) keep what they counted."""
    nodes = tree.nodes
    gone = []
    for block, node in nodes.items():
        if not node[2] and not node[5]:
            gone.append(block)
            if len(gone) >= count:
                break
    for block in gone:
        del nodes[block]


def _binned(source: int, name: str, durations_ns: list[int]) -> list[tuple]:
    """(source, name, bin, count) rows of durations, binned as ``bin_of`` does."""
    ms = np.asarray(durations_ns, dtype=np.float64) / 1e6
    with np.errstate(divide="ignore"):
        bins = np.where(ms < 1.0, 0, 1 + np.floor(BINS_PER_OCTAVE * np.log2(np.maximum(ms, 1.0))))
    values, counts = np.unique(bins.astype(np.int64), return_counts=True)
    return [(source, name, int(b), int(n)) for b, n in zip(values, counts, strict=True)]


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
