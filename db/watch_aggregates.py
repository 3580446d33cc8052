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
| ``watch_series`` | (bucket width, bucket, source, medium): stored, removed, live at the bucket's end, recomputed, routing misses, new (prefill) blocks, both misses at once (the last two since schema v8; NULL in buckets recorded before it whose raw rows were trimmed) |
| ``watch_fleet_series`` | (bucket width, bucket, engine kind): blocks on >= 2 sources, extra copies (end, peak) |
| ``watch_fleet`` | engine kind: duplication now and at peak, prefix-tree node counts |
| ``watch_histograms`` | (source, histogram, bin): lifetime, idle before eviction, reuse gap, removal-to-restore |
| ``watch_shared_prefixes`` | the largest shared prefixes, ranked |

A hash stored again while its source holds it there is counted as re-announced;
it is a second physical copy only in the batch that stored it (two requests
computed one block in one step), and a hit re-announced otherwise (vLLM's
report mode full re-announces every hit block of a request in the step that
hits it, and removes each physical block once): counting those as copies made
held blocks drift upward until the next clear.

Folding has to keep up with a whole fleet's stream, so the state is ints in
dicts, no object per held block, and the usual event (new blocks stored, or
blocks held once removed) is folded with a few C-level dict and set operations
per event, not several per block; an event's chain of new blocks stays one
record in the prefix tree until one of them is needed (``_Chain``).

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
import itertools
import json
import math
import sqlite3
import time
from collections import deque
from collections.abc import Collection, Sequence
from itertools import repeat
from operator import sub

import numpy as np

from kvscope.db.hashmap import HashMap, ObjectMap
from kvscope.db.watch_schema import OP_CLEARED, OP_REMOVED, OP_RESET, OP_STORED, table_columns

BUCKET_WIDTHS_S = (1, 60, 3600)
# Removals the fleet remembers, all sources together, to recognise a hash stored again
# on the source that removed it (recomputation after eviction): the newest this many,
# the oldest forgotten first. A fleet budget, not one per source: 1M per source had let
# 64 sources hold 64M (~10 GB). About 55 bytes each (db/hashmap.py's HashMap slot, 26 B,
# and a share of the ring, whose lists keep the hashes' ints; 110-140 B in dicts, docs/
# watch.md): about 110 MB at the bound. At 570 removals/s (8 busy ranks: issue
# 23's 4M-event hour) that is the last hour.
EVICTED_MEMORY = 2_000_000
TOP_PREFIXES = 20
# The prefix tree keeps every block ever stored up to this many; past it, the
# oldest leaves no source holds any more are forgotten (counts above them stay).
MAX_TREE_NODES = 2_000_000
PREFIX_REFRESH_S = 2.0  # the ranking of shared prefixes is refreshed at most this often
# Histograms: four bins per octave of milliseconds; bin 0 is under 1 ms.
HISTOGRAMS = ("lifetime", "idle_before_evict", "reuse_gap", "restore_gap")
SPAN_HISTOGRAMS = ("lifetime", "idle_before_evict")  # what _Source.spans adds to
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


# Indexes of STAT_COLUMNS in a source's counts.
_STORED, _NEW, _REMOVED, _REANNOUNCED, _RECOMPUTED, _ROUTING, _BOTH, _UNKNOWN = range(8)
_CLEARS, _RESETS, _LIFE_COUNT, _LIFE_SUM = range(8, 12)


class _Shelf:
    """What one source holds on one (medium, group): copies per hash.

    Ints in dicts, no object per block (a list per held block had been most of
    folding's cost): ``born`` is every hash held and when it was stored,
    ``last`` the latest re-store of those stored again, ``more`` the copies
    beyond the first of those held twice or more (rare)."""

    __slots__ = ("born", "last", "more", "copies")

    def __init__(self) -> None:
        self.born = HashMap()  # hash -> stored at (ns)
        self.last = HashMap()  # hash -> stored again at (ns), when it was
        self.more = HashMap()  # hash -> physical copies beyond the first
        self.copies = 0  # physical copies on the shelf


_NOTHING_HELD = HashMap()  # all_held() of a source with no shelf yet (never written)


class _Source:
    """One source's cache as the stream tells it."""

    __slots__ = ("bit", "engine", "tree", "shelves", "on_source", "evicted", "forgotten",
                 "counts", "hist", "spans")  # fmt: skip

    def __init__(self, index: int, engine: str, tree: _Tree) -> None:
        self.bit = 1 << index
        self.engine = engine
        self.tree = tree
        self.shelves: dict[tuple[str, int], _Shelf] = {}  # (medium, group) -> shelf
        # hash -> shelves holding it; kept only once a source has two shelves (an
        # offload tier, hybrid groups): with one, held there is held on the source.
        self.on_source: HashMap | None = None
        # hash -> removed at (ns), while the removal is among the fleet's remembered ones
        # (FleetState._ring says which are oldest; this dict's order means nothing)
        self.evicted = HashMap()
        self.forgotten = 0  # removals let go of under EVICTED_MEMORY, never re-stored by then
        self.counts = [0] * len(STAT_COLUMNS)  # STAT_COLUMNS order; lifetime_sum_s in s
        self.counts[_LIFE_SUM] = 0.0
        # durations (ns) per histogram since the last persist, binned then (numpy)
        self.hist: dict[str, list[int]] = {name: [] for name in HISTOGRAMS}
        # (removed at, [stored at, ...]) of the usual removal event since the last
        # persist: its blocks' lifetimes, which are also their idle times before
        # eviction (none was re-announced), subtracted and binned at persist in numpy
        self.spans: list[tuple[int, list[int]]] = []

    def shelf(self, medium: str, group: int) -> _Shelf:
        key = (medium, group)
        shelf = self.shelves.get(key)
        if shelf is None:
            if len(self.shelves) == 1 and self.on_source is None:
                (only,) = self.shelves.values()
                self.on_source = HashMap()
                self.on_source.put_all(only.born.keys(), 1)
            shelf = self.shelves[key] = _Shelf()
        return shelf

    def held_blocks(self, medium: str) -> int:
        if len(self.shelves) == 1:
            (((m, _), shelf),) = self.shelves.items()
            return len(shelf.born) if m == medium else 0
        return sum(len(s.born) for (m, _), s in self.shelves.items() if m == medium)

    def all_held(self) -> HashMap:
        if self.on_source is not None:
            return self.on_source
        return next(iter(self.shelves.values())).born if self.shelves else _NOTHING_HELD


class _Chain:
    """The blocks one event stored as a chain of new nodes, while nothing has touched
    any of them since (no child but the next one, no other source storing one, no walk
    up through them): one record for them all instead of a node each, made into the
    nodes (``_unchain``) the first time one of them is needed. New blocks its source
    stores under its last block extend it (``FleetState._extend``): a session's next
    turn, a request's decode steps. So a stream that keeps growing its chains at their
    ends keeps a record per chain, and one whose chains are left alone spares the
    nodes."""

    __slots__ = ("parent", "depth", "hashes", "bits", "owned")

    def __init__(self, parent: int | None, depth: int, hashes: list[int], bits: int) -> None:
        self.parent = parent  # of the first block
        self.depth = depth  # of the first block's parent (0: a root)
        self.hashes = hashes  # the event's list, until extended (then its own: owned)
        self.bits = bits
        self.owned = False


def _unchain(nodes: ObjectMap, chain: _Chain, block: int) -> list:
    """Make ``chain``'s nodes, as they would have been made at once; returns ``block``'s."""
    hashes = chain.hashes
    n = len(hashes)
    depth, bits = chain.depth, chain.bits
    up = chain.parent
    above = None  # the first block's parent node: looked up when walked to
    for i, h in enumerate(hashes):
        if nodes.get(h) is chain:
            above = nodes[h] = [up, depth + i + 1, 1 if i < n - 1 else 0, n - i, bits, above]
        else:
            above = None
        up = h
    return nodes[block]


def _parent_node(nodes: ObjectMap, parent: int) -> list | None:
    node = nodes.get(parent)
    if node.__class__ is _Chain:
        node = _unchain(nodes, node, parent)
    return node


def _hang(tree: _Tree, parent: int | None) -> list | None:
    """One more child under ``parent`` in ``tree`` (its node made from its chain if need
    be): the parent's node, or None when it is not in the tree, and the child a new root."""
    nodes = tree.nodes
    above = nodes.get(parent) if parent is not None else None
    if above.__class__ is _Chain:
        above = _unchain(nodes, above, parent)
    if above is None:
        tree.roots += 1
        return None
    above[2] += 1
    if above[2] == 2:
        tree.branch_points.add(parent)
    return above


class _Tree:
    """The prefix tree of one engine kind: every block ever stored, by its parent,
    and which sources hold each block now (the fleet's duplication).

    Who holds a block is kept in ``held`` only for blocks two or more sources have
    stored (their node's bits): a block one source alone ever stored is held by
    that source exactly while one of its shelves holds it (``holders``). Most blocks
    are one source's, so most stores and removals touch no fleet-wide dict."""

    __slots__ = ("nodes", "held", "by_bit", "branch_points", "roots", "max_depth", "duplicated",
                 "extra", "peak")  # fmt: skip

    def __init__(self) -> None:
        # hash -> [parent, depth, children, subtree size, sources that stored it (bits),
        # parent's node (None where it was not made with it: a chain's first block, a
        # root)], or the _Chain it is part of. The parent's node spares a walk up the
        # tree (every block stored adds to its ancestors' subtree sizes) a dict lookup
        # a step: a multi-turn session's chain is hundreds of blocks deep.
        self.nodes = ObjectMap()
        # hash -> sources holding it now (bits), never 0: of hashes >= 2 sources stored
        self.held: dict[int, int] = {}
        self.by_bit: dict[int, _Source] = {}  # the tree's sources, by their bit
        self.branch_points: set[int] = set()
        self.roots = 0
        self.max_depth = 0
        self.duplicated = 0  # hashes held by >= 2 sources now
        self.extra = 0  # copies beyond the first, across sources
        self.peak = 0

    def holders(self, block: int, stored_by: int) -> int:
        """The sources holding ``block`` now (bits), given those that stored it."""
        if stored_by & (stored_by - 1):
            return self.held.get(block, 0)
        src = self.by_bit.get(stored_by)
        return stored_by if src is not None and block in src.all_held() else 0

    def add_holder(self, block: int, stored_by: int, bit: int) -> bool:
        """Source ``bit`` holds ``block`` now, new on it, which others stored too
        (``stored_by``: its node's bits before this store): the fleet's holders and
        duplication updated; returns whether another source holds it (a routing miss)."""
        mask = self.holders(block, stored_by) & ~bit
        self.held[block] = mask | bit
        if not mask:
            return False
        self.extra += 1
        if mask & (mask - 1) == 0:
            self.duplicated += 1
        return True

    def stored_by(self, block: int) -> int:
        """The sources that stored ``block`` (bits; 0: none, or the tree forgot it)."""
        node = self.nodes.get(block)
        if node is None:
            return 0
        return node.bits if node.__class__ is _Chain else node[4]


class FleetState:
    """Every source's cache, the fleet's holders and the prefix trees of one run."""

    def __init__(self, run_id: int, origin_ns: int) -> None:
        self.run_id = run_id
        self.origin_ns = origin_ns
        self.sources: dict[int, _Source] = {}
        self.trees: dict[str, _Tree] = {}
        self.applied_rowid = 0
        # deltas since the last persist: (width, bucket, source, medium) -> [stored,
        # removed, live, recomputed, routing, new, both]; live is the value at the last event
        self._series: dict[tuple, list[int]] = {}
        self._fleet_series: dict[
            tuple, list[int]
        ] = {}  # (width, bucket, engine) -> [dup, extra, peak]
        self._prefixes_at = 0.0
        self._prefixes_dirty = False
        # (source, medium) -> _note_entries' last answer; reset with the dicts above
        self._note_at: dict[tuple, tuple] = {}
        self._series_sql: tuple[str, int] | None = None  # _series_sql's, on the first persist
        self._stats_sql: tuple[str, bool] | None = None  # _stats_sql's, on the first persist
        # The fleet's remembered removals, oldest first: (source, removed at, hashes,
        # whether that list is the ring's own, so a batch's one-hash removals can share
        # it), an entry per removal event (or batch) rather than per hash; a hash
        # whose source's ``evicted`` no longer says that time (re-stored, removed again,
        # cleared) is stale there and forgets nothing. ``_remembered``: hashes in it.
        self._ring: deque[tuple] = deque()
        self._remembered = 0

    # --- feeding ----------------------------------------------------------------------

    def _tree(self, engine: str) -> _Tree:
        tree = self.trees.get(engine)
        if tree is None:
            tree = self.trees[engine] = _Tree()
        return tree

    def add_source(self, index: int, engine: str | None) -> None:
        src = self.sources.get(index)
        if src is None:
            src = self.sources[index] = _Source(index, engine or "", self._tree(engine or ""))
        elif engine and src.engine != engine and not src.shelves:
            del src.tree.by_bit[src.bit]
            src.engine, src.tree = engine, self._tree(engine)
        src.tree.by_bit[src.bit] = src

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
        store, remove, note = self._store, self._remove, self._note
        if hash_lists is None:
            hash_lists = [None] * len(rows)
        # The series and fleet figures are noted once per run of rows of one source,
        # timestamp and medium (a batch's events, mostly), not once per event: sums
        # over the run, the values at its end. The fleet's peak is the highest of those
        # ends: the events of one engine step are published at once, and the order
        # they come in within it is no moment the fleet was in (so the recorder may
        # share one row among a batch's removals).
        run_src = run_source = run_ts = run_m = None
        run = [0, 0, 0, 0, 0, 0]  # stored, removed, recomputed, routing, new, both
        for row, hashes in zip(rows, hash_lists, strict=True):
            source, _seq, ts_ns, op, text, parent, medium, group, _n = row
            m = NO_MEDIUM if medium is None else medium
            opened = source != run_source or ts_ns != run_ts or m != run_m
            if opened:
                if run_src is not None:
                    note(run_src, run_source, run_m, run_ts, run)
                    run = [0, 0, 0, 0, 0, 0]
                run_src = sources.get(source)
                if run_src is None:
                    run_src = self._source(source)
                run_source, run_ts, run_m = source, ts_ns, m
            if hashes is None and text:
                hashes = json.loads(text)
            if op == OP_STORED:
                if hashes:
                    store(run_src, ts_ns, hashes, parent, m, NO_GROUP if group is None else group,
                          run)  # fmt: skip
            elif op == OP_REMOVED:
                if hashes:
                    remove(run_src, ts_ns, hashes, m, NO_GROUP if group is None else group, run)
            elif op in (OP_CLEARED, OP_RESET):
                if not opened:  # the rows before it in its run
                    note(run_src, run_source, run_m, run_ts, run)
                    run = [0, 0, 0, 0, 0, 0]
                self._clear(run_src, source, ts_ns, op)
                run_src = run_source = None  # the clear noted itself
        if run_src is not None:
            note(run_src, run_source, run_m, run_ts, run)

    def _note(self, src: _Source, source: int, medium: str, ts_ns: int, run: list[int]) -> None:
        """A run's figures into the series of each bucket width: ``run`` (stored,
        removed, recomputed, routing, new, both) added, live blocks and the fleet's
        duplication as they are now (the peak: the highest of these)."""
        tree = src.tree
        dup, extra = tree.duplicated, tree.extra
        if extra > tree.peak:
            tree.peak = extra
        rel = ts_ns - self.origin_ns
        # Consecutive runs of a source mostly fall in the same second, hence in the
        # same bucket of every (wider, multiple) width: their entries are kept at hand
        # (until persist starts new dicts) instead of looked up per width and run.
        cached = self._note_at.get((source, medium))
        if cached is None or cached[0] != rel // 1_000_000_000:
            cached = self._note_entries(src, source, medium, rel)
        _, s1, s2, s3, f1, f2, f3 = cached
        stored, removed, recomputed, routing, new, both = run
        # The source's totals move with its runs' (added here, not per event).
        counts = src.counts
        counts[_STORED] += stored
        counts[_REMOVED] += removed
        counts[_NEW] += new
        counts[_RECOMPUTED] += recomputed
        counts[_ROUTING] += routing
        counts[_BOTH] += both
        live = src.held_blocks(medium)
        for s in (s1, s2, s3):
            s[0] += stored
            s[1] += removed
            s[2] = live
            s[3] += recomputed
            s[4] += routing
            s[5] += new
            s[6] += both
        for f in (f1, f2, f3):
            f[0] = dup
            f[1] = extra
            if extra > f[2]:
                f[2] = extra

    def _note_entries(self, src: _Source, source: int, medium: str, rel: int) -> tuple:
        """(1 s bucket, the series entries, the fleet entries) of ``rel`` in each width, made
        (zero series counts, fleet counts set by the caller) where missing."""
        series, fleet = self._series, self._fleet_series
        mine, fleets = [], []
        for w in BUCKET_WIDTHS_S:
            b = rel // (w * 1_000_000_000)
            entry = series.get((w, b, source, medium))
            if entry is None:
                entry = series[(w, b, source, medium)] = [0, 0, 0, 0, 0, 0, 0]
            mine.append(entry)
            entry = fleet.get((w, b, src.engine))
            if entry is None:
                # peak starts at the first value, as a fresh entry did before
                tree = src.tree
                entry = fleet[(w, b, src.engine)] = [tree.duplicated, tree.extra, tree.extra]
            fleets.append(entry)
        cached = self._note_at[(source, medium)] = (rel // 1_000_000_000, *mine, *fleets)
        return cached

    def _store(self, src: _Source, ts_ns: int, hashes: list[int], parent: int | None,
               m: str, g: int, run: list[int]) -> None:  # fmt: skip
        """Fold a BlockStored in (its figures into ``run``)."""
        shelf = src.shelves.get((m, g))
        if shelf is None:
            shelf = src.shelf(m, g)
        born = shelf.born
        n = len(hashes)
        tree, bit = src.tree, src.bit
        if n == 1 and src.on_source is None and hashes[0] not in born:
            # One new block (decode-like streams): the same as below, without a call in C
            # per step that a one-hash event would pay for nothing.
            block = hashes[0]
            born[block] = ts_ns
            shelf.copies += 1
            run[0] += 1
            run[4] += 1
            evicted = src.evicted
            removed_at = evicted.pop(block, None) if evicted else None
            if removed_at is not None:
                run[2] += 1
                src.hist["restore_gap"].append(ts_ns - removed_at)
            nodes = tree.nodes
            node = nodes.get(block)
            if node is not None:
                if node.__class__ is _Chain:
                    node = _unchain(nodes, node, block)
                stored_by = node[4]
                if stored_by != bit:  # another source stored it: the fleet keeps its holders
                    if tree.add_holder(block, stored_by, bit):
                        run[3] += 1  # another source of this engine kind holds it
                        if removed_at is not None:
                            run[5] += 1
                    node[4] = stored_by | bit
                return
            if parent is not None and parent != block and self._extend(tree, parent, hashes, bit):
                return
            above = _hang(tree, parent if parent != block else None)
            depth = 1 if above is None else above[1] + 1
            if depth > tree.max_depth:
                tree.max_depth = depth
            nodes[block] = [parent, depth, 0, 1, bit, above]
            self._prefixes_dirty = True
            if above is not None:
                self._above(tree, parent, 1, above)
            return
        # New content (a prompt's prefill): blocks the prefix tree has never seen, so
        # neither this shelf nor any source holds one (a block held anywhere is in the
        # tree: it forgets only blocks held nowhere): one look in the tree, none there.
        if src.on_source is None and tree.nodes.isdisjoint(hashes):
            if born.put_all(hashes, ts_ns) == n:
                shelf.copies += n
                recomputed = 0
                evicted = src.evicted
                if evicted and not evicted.isdisjoint(hashes):  # removed, then pruned
                    back = evicted.pop_held(hashes)
                    src.hist["restore_gap"] += map(sub, repeat(ts_ns), back)
                    recomputed = len(back)
                run[0] += n
                run[2] += recomputed
                run[4] += n
                self._new_chain(tree, hashes, parent, bit)
                return
            born.pop_all(hashes)  # a hash twice in the event: undone, and taken block by block
        # The usual event: blocks no shelf of a one-shelf source holds, none twice in
        # the event. Its cache, evicted memory and holders are updated in C, a call
        # per event rather than a few per block.
        elif src.on_source is None and (not born or born.isdisjoint(hashes)):
            if born.put_all(hashes, ts_ns) == n:
                shelf.copies += n
                evicted = src.evicted
                back = None
                recomputed = routing = both = 0
                if evicted and not evicted.isdisjoint(hashes):
                    back = {h for h in hashes if h in evicted}
                    if back:
                        restore = src.hist["restore_gap"]
                        for h in back:
                            restore.append(ts_ns - evicted.pop(h))
                        recomputed = len(back)
                # the fleet's holders of blocks other sources stored: kept as it grows
                routing, both = self._grow(tree, hashes, parent, bit, distinct=True,
                                           back=back or ())  # fmt: skip
                run[0] += n
                run[2] += recomputed
                run[3] += routing
                run[4] += n
                run[5] += both
                return
            born.pop_all(hashes)  # a hash twice in the event: undone, and taken block by block
        self._store_blocks(src, shelf, ts_ns, hashes, run)
        self._grow(tree, hashes, parent, bit)

    def _store_blocks(self, src: _Source, shelf: _Shelf, ts_ns: int, hashes: list[int],
                      run: list[int]) -> None:  # fmt: skip
        """``_store``'s cache part block by block: anything but the usual event."""
        born, last, more = shelf.born, shelf.last, shelf.more
        on_source, counts, evicted = src.on_source, src.counts, src.evicted
        reuse, restore = src.hist["reuse_gap"], src.hist["restore_gap"]
        tree, bit = src.tree, src.bit
        recomputed = routing = both = new = reannounced = copies = 0
        for block in hashes:
            stored_at = born.get(block)
            if stored_at is not None:
                # Stored while held here: a hit re-announced (report mode full) when in a
                # later batch than the store that made it held; in the same batch, two
                # requests computed it at once, and it is a second physical copy.
                reannounced += 1
                reuse.append(ts_ns - last.get(block, stored_at))
                last[block] = ts_ns
                if stored_at == ts_ns:
                    more[block] = more.get(block, 0) + 1
                    copies += 1
                continue
            born[block] = ts_ns
            copies += 1
            if on_source is not None:
                n = on_source.get(block, 0)
                on_source[block] = n + 1
                if n:
                    continue  # on another medium or group of this source already
            new += 1
            removed_at = evicted.pop(block, None) if evicted else None
            if removed_at is not None:
                recomputed += 1
                restore.append(ts_ns - removed_at)
            stored_by = tree.stored_by(block)  # its node's bits: _grow adds ours after
            if stored_by and stored_by != bit and tree.add_holder(block, stored_by, bit):
                routing += 1  # another source of this engine kind holds it
                if removed_at is not None:
                    both += 1
        shelf.copies += copies
        counts[_REANNOUNCED] += reannounced
        run[0] += len(hashes)
        run[2] += recomputed
        run[3] += routing
        run[4] += new
        run[5] += both

    def _grow(self, tree: _Tree, hashes: list[int], parent: int | None, bit: int, *,
              distinct: bool = False, back: Collection[int] | None = None) -> tuple[int, int]:  # fmt: skip
        """The prefix tree: every block ever stored, chained to its parent (``distinct``:
        no hash twice in ``hashes``). With ``back`` (those of them the source had
        removed), every block is new on the source, and the fleet's holders of those
        other sources stored are kept here, on the way: returns (routing misses, of
        them in ``back``)."""
        nodes = tree.nodes
        n = len(hashes)
        if nodes.isdisjoint(hashes) and (distinct or len(set(hashes)) == n):
            self._new_chain(tree, hashes, parent, bit)
            return 0, 0
        chain = []
        created = routing = both = 0
        par = parent
        for block in hashes:
            node = nodes.get(block)
            if node.__class__ is _Chain:
                node = _unchain(nodes, node, block)
            if node is None:
                above = _hang(tree, par if par != block else None)
                depth = 1 if above is None else above[1] + 1
                if depth > tree.max_depth:
                    tree.max_depth = depth
                node = nodes[block] = [par, depth, 0, 0, bit, above]  # subtree 0: new
                created += 1
            else:
                stored_by = node[4]
                if stored_by != bit:
                    if back is not None and tree.add_holder(block, stored_by, bit):
                        routing += 1  # another source of this engine kind holds it
                        both += block in back
                    node[4] = stored_by | bit
            chain.append(node)
            par = block
        if not created:
            return routing, both
        added = 0
        # Only nodes made by this call have a subtree of 0.
        for node in reversed(chain):
            fresh = node[3] == 0
            node[3] += added + fresh
            added += fresh
        self._above(tree, chain[0][0], added, chain[0][5])
        return routing, both

    def _new_chain(self, tree: _Tree, hashes: list[int], parent: int | None, bit: int) -> None:
        """``hashes``, none in the tree and none twice, as a chain of new blocks, made in
        C: block i's parent is block i-1, it has one child (the last none) and n - i
        blocks under it."""
        if parent is not None and self._extend(tree, parent, hashes, bit):
            return
        n = len(hashes)
        above = _hang(tree, parent)
        depth = 0 if above is None else above[1]
        if depth + n > tree.max_depth:
            tree.max_depth = depth + n
        tree.nodes.put_all(hashes, _Chain(parent, depth, hashes, bit))
        if above is not None:
            self._above(tree, parent, n, above)
        else:  # a root: nothing above to count it in
            self._prefixes_dirty = True

    def _extend(self, tree: _Tree, parent: int, hashes: list[int], bit: int) -> bool:
        """``hashes`` (none in the tree, none twice) added to the chain whose last block is
        ``parent``, if the same source stored it: the blocks the chain's nodes and a new
        chain would have made, counted in the chain's blocks (their subtree sizes are
        the blocks after them) and above it. Returns whether it did."""
        nodes = tree.nodes
        chain = nodes.get(parent)
        if chain.__class__ is not _Chain or chain.bits != bit or chain.hashes[-1] != parent:
            return False
        if not chain.owned:
            chain.hashes, chain.owned = list(chain.hashes), True
        chain.hashes += hashes
        depth = chain.depth + len(chain.hashes)
        if depth > tree.max_depth:
            tree.max_depth = depth
        nodes.put_all(hashes, chain)
        self._above(tree, chain.parent, len(hashes))
        return True

    def _above(self, tree: _Tree, up: int | None, added: int, node: list | None = None) -> None:
        """``added`` blocks more under ``up`` (``node``: its node, where the caller has it)
        and each of its ancestors: up the parent nodes a node keeps, or by the parent's
        hash where it keeps none (a chain's first block, a root whose parent came
        later)."""
        self._prefixes_dirty = True
        nodes = tree.nodes
        if node is None:
            node = None if up is None else _parent_node(nodes, up)
            if node is None:
                return
        steps, limit = 0, len(nodes)
        while steps <= limit:  # the limit: a cycle of hashes stops
            node[3] += added
            steps += 1
            up = node[5]
            if up is None:
                if node[0] is None:
                    return
                up = _parent_node(nodes, node[0])
                if up is None:
                    return
            node = up

    def _remove(self, src: _Source, ts_ns: int, hashes: list[int], m: str, g: int,
                run: list[int]) -> None:  # fmt: skip
        """Fold a BlockRemoved in (its figures into ``run``)."""
        shelf = src.shelves.get((m, g))
        if shelf is None:
            shelf = src.shelf(m, g)
        born = shelf.born
        n = len(hashes)
        run[1] += n
        counts = src.counts
        if n == 1 and src.on_source is None:
            # One block held once (decode-like streams): as below, without the calls.
            block = hashes[0]
            stored_at = born.get(block)
            if stored_at is not None and not (shelf.more and block in shelf.more):
                del born[block]
                shelf.copies -= 1
                life = ts_ns - stored_at
                hist = src.hist
                hist["lifetime"].append(life)
                last = shelf.last
                hist["idle_before_evict"].append(
                    ts_ns - last.pop(block, stored_at) if last else life
                )
                counts[_LIFE_COUNT] += 1
                counts[_LIFE_SUM] += life / 1e9
                src.evicted[block] = ts_ns
                ring = self._ring
                tail = ring[-1] if ring else None
                if tail is not None and tail[3] and tail[0] is src and tail[1] == ts_ns:
                    tail[2].append(block)  # the batch's one-hash removals: one entry
                else:
                    ring.append((src, ts_ns, [block], True))
                self._remembered += 1
                if self._remembered > EVICTED_MEMORY:
                    self._forget()
                tree, bit = src.tree, src.bit
                held = tree.held
                mask = held.get(block, 0) if held else 0
                if mask == bit:
                    del held[block]
                elif mask & bit:
                    mask &= ~bit
                    held[block] = mask
                    tree.extra -= 1
                    if mask & (mask - 1) == 0:
                        tree.duplicated -= 1
                return
        # The usual event: one copy of each, held on a one-shelf source: in C. Popped
        # without a look first: a hash not held (or twice in the event) pops None, and
        # what was popped is put back for the block-by-block path.
        if src.on_source is None and (not shelf.more or shelf.more.isdisjoint(hashes)):
            births = born.pop_all(hashes)
            if None not in births:
                shelf.copies -= n
                last = shelf.last
                if last and not last.isdisjoint(hashes):
                    hist = src.hist
                    hist["lifetime"] += map(sub, repeat(ts_ns, n), births)
                    hist["idle_before_evict"] += [
                        ts_ns - last.pop(h, b) for h, b in zip(hashes, births, strict=True)
                    ]
                else:
                    # lifetime = idle before evict = ts_ns - birth, binned at persist
                    src.spans.append((ts_ns, births))
                counts[_LIFE_COUNT] += n
                counts[_LIFE_SUM] += (n * ts_ns - sum(births)) / 1e9
                src.evicted.put_all(hashes, ts_ns)
                self._ring.append((src, ts_ns, hashes, False))  # the event's list, kept
                self._remembered += n
                if self._remembered > EVICTED_MEMORY:
                    self._forget()
                tree = src.tree
                held = tree.held  # only blocks other sources stored too are in it
                if held and not held.keys().isdisjoint(hashes):
                    bit = src.bit
                    for h in hashes:
                        mask = held.pop(h, 0) & ~bit
                        if mask:  # another source holds it still
                            held[h] = mask
                            tree.extra -= 1
                            if mask & (mask - 1) == 0:
                                tree.duplicated -= 1
                return
            # a hash not held, or twice in the event: put back, and taken block by block
            born.put_back(hashes, births)
        self._remove_blocks(src, shelf, ts_ns, hashes)

    def _remove_blocks(self, src: _Source, shelf: _Shelf, ts_ns: int,
                       hashes: list[int]) -> None:  # fmt: skip
        """``_remove`` block by block: anything but the usual event."""
        born, last, more = shelf.born, shelf.last, shelf.more
        on_source, counts, evicted = src.on_source, src.counts, src.evicted
        lifetimes, idle = src.hist["lifetime"], src.hist["idle_before_evict"]
        tree, bit = src.tree, src.bit
        held = tree.held
        copies = life_ns = unknown = lives = 0
        remembered = []
        for block in hashes:
            stored_at = born.get(block)
            if stored_at is None:
                unknown += 1
                if on_source is None or block not in on_source:
                    evicted[block] = ts_ns  # an older ring entry of it is stale now
                    remembered.append(block)
                continue
            copies += 1
            extra = more.get(block)
            if extra:
                if extra == 1:
                    del more[block]
                else:
                    more[block] = extra - 1
                continue  # another physical copy still holds it
            del born[block]
            life = ts_ns - stored_at
            life_ns += life
            lives += 1
            lifetimes.append(life)
            idle.append(ts_ns - last.pop(block, stored_at))
            if on_source is not None:
                k = on_source[block] - 1
                if k:
                    on_source[block] = k
                    continue
                del on_source[block]
            evicted[block] = ts_ns
            remembered.append(block)
            mask = held.get(block, 0)  # the fleet: this source no longer holds it
            if mask & bit:
                mask &= ~bit
                if mask:
                    held[block] = mask
                    tree.extra -= 1
                    if mask & (mask - 1) == 0:
                        tree.duplicated -= 1
                else:
                    del held[block]
        shelf.copies -= copies
        counts[_UNKNOWN] += unknown
        counts[_LIFE_COUNT] += lives
        counts[_LIFE_SUM] += life_ns / 1e9
        if remembered:
            self._ring.append((src, ts_ns, remembered, True))
            self._remembered += len(remembered)
            if self._remembered > EVICTED_MEMORY:
                self._forget()

    def _forget(self) -> None:
        """Let go of the fleet's oldest remembered removals past ``EVICTED_MEMORY``
        (an entry at a time, in C)."""
        ring = self._ring
        over = self._remembered - EVICTED_MEMORY
        while over > 0 and ring:
            src, ts_ns, hashes, _ = ring.popleft()
            n = len(hashes)
            if n > over:  # the newer part of the entry stays remembered
                ring.appendleft((src, ts_ns, hashes[over:], True))
                hashes = hashes[:over]
                n = over
            over -= n
            self._remembered -= n
            evicted = src.evicted
            if not evicted:
                continue
            # Popped without a look first, one dict operation a hash (a hash removed twice
            # in one event is in the entry twice: its second pop finds None); what was
            # popped that is not this removal's (stale here: removed again since) goes back.
            popped = evicted.pop_all(hashes)
            mine = popped.count(ts_ns)
            src.forgotten += mine
            if mine + popped.count(None) != n:
                for h, at in zip(hashes, popped, strict=True):
                    if at is not None and at != ts_ns:
                        evicted[h] = at

    def _clear(self, src: _Source, source: int, ts_ns: int, op: int) -> None:
        src.counts[_CLEARS if op == OP_CLEARED else _RESETS] += 1
        tree, bit = src.tree, src.bit
        held = tree.held
        for block in src.all_held() if held else ():
            mask = held.get(block, 0)
            if mask & bit:
                mask &= ~bit
                if mask:
                    held[block] = mask
                    tree.extra -= 1
                    if mask & (mask - 1) == 0:
                        tree.duplicated -= 1
                else:
                    del held[block]
        for shelf in src.shelves.values():
            shelf.born.clear()
            shelf.last.clear()
            shelf.more.clear()
            shelf.copies = 0  # kept at 0 so a chart's line drops to 0
        if src.on_source is not None:
            src.on_source.clear()
        src.evicted.clear()  # a reset is not a capacity miss: what follows is a fresh cache
        for m in {m for m, _ in src.shelves}:
            self._note(src, source, m, ts_ns, [0, 0, 0, 0, 0, 0])

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
        if self._stats_sql is None:
            self._stats_sql = _stats_sql(conn, r)
        sql, forgotten = self._stats_sql
        conn.executemany(
            sql,
            [
                (i, *s.counts, s.forgotten) if forgotten else (i, *s.counts)
                for i, s in self.sources.items()
            ],
        )
        conn.executemany(
            f"INSERT OR REPLACE INTO watch_live VALUES ({r}, ?, ?, ?, ?, ?)",
            [
                (i, m, g, len(shelf.born), shelf.copies)
                for i, s in self.sources.items()
                for (m, g), shelf in s.shelves.items()
            ],
        )
        if self._series:
            if self._series_sql is None:
                self._series_sql = _series_sql(conn, r)
            sql, counts = self._series_sql
            conn.executemany(sql, [(*k, *v[:counts]) for k, v in self._series.items()])
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
        rows = _histogram_rows(self.sources)
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


def _stats_sql(conn: sqlite3.Connection, run_id: int) -> tuple[str, bool]:
    """The upsert of a source's stats (``STAT_COLUMNS``, then its forgotten removals)
    and whether it writes the forgotten ones: only where ``watch_source_stats`` has
    their column (schema v9; migrations 6 and 8 fold runs before it exists)."""
    forgotten = "forgotten_removals" in table_columns(conn, "watch_source_stats")
    names = ", ".join(STAT_COLUMNS) + (", forgotten_removals" if forgotten else "")
    values = ", ".join("?" * (len(STAT_COLUMNS) + forgotten))
    return (
        f"INSERT OR REPLACE INTO watch_source_stats (run_id, source, {names}) "
        f"VALUES ({run_id}, ?, {values})",
        forgotten,
    )


def _series_sql(conn: sqlite3.Connection, run_id: int) -> tuple[str, int]:
    """The upsert of series deltas and how many of an entry's counts it writes: all
    seven, or the first five where ``watch_series`` is older than schema v8 (migration
    6 folds runs before migration 8 adds the columns, and folds them again)."""
    sql = (
        "ON CONFLICT DO UPDATE SET stored = stored + excluded.stored, "
        "removed = removed + excluded.removed, live = excluded.live, "
        "recomputed = recomputed + excluded.recomputed, "
        "routing_misses = routing_misses + excluded.routing_misses"
    )
    if "new_blocks" not in table_columns(conn, "watch_series"):
        return f"INSERT INTO watch_series VALUES ({run_id}, {', '.join('?' * 9)}) {sql}", 5
    return (
        f"INSERT INTO watch_series (run_id, {SERIES_COLUMNS}) VALUES ({run_id}, "
        f"{', '.join('?' * 11)}) {sql}, "
        # NULL (recorded before v8, raw rows trimmed) stays NULL: still unknown
        "new_blocks = new_blocks + excluded.new_blocks, "
        "both_misses = both_misses + excluded.both_misses",
        7,
    )


def _prune(tree: _Tree, count: int) -> None:
    """Forget up to ``count`` of the oldest leaves that no source holds: a week-long
    watch's tree stays bounded; the figures above them (children seen, blocks
    stored under) keep what they counted. A ``_Chain`` none of whose blocks is held
    is a path of leaves (nothing hangs below its blocks but the next one) and goes
    whole, unmade: taking only its last block, and making its nodes to do so, had
    pruned one block in a chain's length and kept the tree growing, each persist
    scanning it all."""
    nodes, by_bit = tree.nodes, tree.by_bit
    gone: list[int] = []
    chains: list[_Chain] = []
    taken = 0
    for block, node in nodes.items():
        if node.__class__ is _Chain:
            hashes = node.hashes
            if block != hashes[0]:
                continue  # a chain is taken at its first block, whole
            # one source stored it (another's store of a block would have made its nodes)
            src = by_bit.get(node.bits)
            if src is not None and not src.all_held().isdisjoint(hashes):
                continue
            chains.append(node)
            taken += len(hashes)
        elif not node[2] and not tree.holders(block, node[4]):
            gone.append(block)
            taken += 1
        else:
            continue
        if taken >= count:
            break
    for block in gone:
        del nodes[block]
    for chain in chains:
        deque(map(nodes.__delitem__, chain.hashes), 0)


_BIN_KEYS = 256  # above any bin of an int64 of ns (2^63 ns is in bin 173)


def _histogram_rows(sources: dict[int, _Source]) -> list[tuple]:
    """(source, histogram, bin, count) of every source's durations since the last
    persist (taken from them), binned and counted in one numpy pass for the whole
    fleet: per source and histogram it had been a dozen numpy calls each, most of a
    persist's time with 64 sources."""
    spans: list[tuple[int, list[int]]] = []  # every source's, with ...
    span_sources: list[int] = []  # ... its source, per span
    flat: list[int] = []  # every other duration, with ...
    flat_keys: list[int] = []  # ... its (source, histogram) as source * kinds + histogram
    kinds = len(HISTOGRAMS)
    for i, s in sources.items():
        if s.spans:
            spans += s.spans
            span_sources += [i] * len(s.spans)
            s.spans = []
        for h, durations in enumerate(s.hist.values()):  # in HISTOGRAMS order
            if durations:
                flat += durations
                flat_keys += [i * kinds + h] * len(durations)
                durations.clear()
    rows = []
    if spans:  # a span's blocks' lifetimes are also their idle times before eviction
        lengths, durations_ns = _span_durations(spans)
        keys = np.repeat(np.asarray(span_sources, np.int64), lengths)
        for key, n in _counted(keys * _BIN_KEYS + _bins(durations_ns)):
            source, b = divmod(key, _BIN_KEYS)
            rows += [(source, name, b, n) for name in SPAN_HISTOGRAMS]
    if flat:
        keys = np.asarray(flat_keys, np.int64)
        for key, n in _counted(keys * _BIN_KEYS + _bins(np.asarray(flat, np.int64))):
            source_kind, b = divmod(key, _BIN_KEYS)
            rows.append((source_kind // kinds, HISTOGRAMS[source_kind % kinds], b, n))
    return rows


def _counted(keys: np.ndarray) -> list[tuple[int, int]]:
    """(key, how many times) of non-negative int keys, by a count per key when they are
    dense enough (no sort), else np.unique."""
    if keys.max() < 1 << 22:
        counts = np.bincount(keys)
        present = np.flatnonzero(counts)
        return list(zip(present.tolist(), counts[present].tolist(), strict=True))
    values, counts = np.unique(keys, return_counts=True)
    return list(zip(values.tolist(), counts.tolist(), strict=True))


def _span_durations(spans: list[tuple[int, list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """The number of blocks of each of ``_Source.spans`` and their durations (ns):
    each removal time less its blocks' births."""
    lengths = np.fromiter(map(len, (b for _, b in spans)), np.int64, len(spans))
    births = np.fromiter(
        itertools.chain.from_iterable(b for _, b in spans), np.int64, int(lengths.sum())
    )
    removed = np.repeat(np.fromiter((t for t, _ in spans), np.int64, len(spans)), lengths)
    return lengths, removed - births


def _bins(durations_ns: np.ndarray) -> np.ndarray:
    """Each duration's bin, as ``bin_of`` gives it."""
    ms = durations_ns.astype(np.float64) / 1e6
    with np.errstate(divide="ignore"):
        bins = np.where(ms < 1.0, 0, 1 + np.floor(BINS_PER_OCTAVE * np.log2(np.maximum(ms, 1.0))))
    return bins.astype(np.int64)


def _bits(mask: int) -> str:
    return ",".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1)


def rebuild(conn: sqlite3.Connection, run_id: int, chunk: int = 50_000) -> FleetState:
    """A run's state folded from its raw rows (a database recorded before the
    aggregates existed, or a watch resumed on the same run)."""
    from kvscope.db.source import run_origin

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


def rebuild_all(conn: sqlite3.Connection, *, untrimmed_only: bool = False) -> list[int]:
    """Every watch run's aggregates from its raw rows (migration 6); ``untrimmed_only``:
    only runs that still hold all their raw rows (no ``--keep-raw`` trim). Returns
    the runs rebuilt."""
    sql = "SELECT id FROM runs WHERE kind = 'watch'"
    if untrimmed_only:
        sql += (
            " AND id NOT IN (SELECT run_id FROM watch_agg_state "
            "WHERE raw_trimmed_before IS NOT NULL)"
        )
    runs = [r[0] for r in conn.execute(sql + " ORDER BY id")]
    for run_id in runs:
        rebuild(conn, run_id)
    return runs


def add_prefill_series(db) -> None:
    """Schema v8: per-bucket new (prefill) blocks and both-at-once misses in
    ``watch_series``, so a window's shares of prefill are the window's. Runs whose
    raw rows are all there are folded again to fill them; buckets of runs trimmed
    by ``--keep-raw`` stay NULL (their state at the trim is gone): the views say
    the shares are unknown there."""
    db.execute("ALTER TABLE watch_series ADD COLUMN new_blocks INTEGER")
    db.execute("ALTER TABLE watch_series ADD COLUMN both_misses INTEGER")
    rebuild_all(db.conn, untrimmed_only=True)


def add_forgotten_removals(db) -> None:
    """Schema v9: ``watch_source_stats.forgotten_removals``, the removals a source's
    memory of removed hashes let go of under the fleet-wide ``EVICTED_MEMORY``
    (a re-store of one of those counts as new prefill, not as recomputation).
    Runs recorded before say 0: their per-source bound was not counted."""
    db.execute(
        "ALTER TABLE watch_source_stats ADD COLUMN forgotten_removals INTEGER NOT NULL DEFAULT 0"
    )
