"""``WatchFold``: one run's block rows folded, in arrival order, into every source's
cache, the fleet's holders and the prefix trees, and what changed handed over as
rows for the aggregate tables."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from itertools import repeat
from operator import sub

from kvscope.db.watch_aggregates import (
    BUCKET_WIDTHS_S,
    NO_GROUP,
    NO_MEDIUM,
    TOP_PREFIXES,
    AggregateRows,
)
from kvscope.db.watch_schema import OP_CLEARED, OP_REMOVED, OP_RESET, OP_STORED
from kvscope.profiler.watch.fold.histograms import histogram_rows
from kvscope.profiler.watch.fold.prefix_tree import Chain, PrefixTree
from kvscope.profiler.watch.fold.removal_memory import RemovalMemory
from kvscope.profiler.watch.fold.source_cache import (
    BOTH,
    CLEARS,
    LIFE_COUNT,
    LIFE_SUM,
    NEW,
    REANNOUNCED,
    RECOMPUTED,
    REMOVED,
    RESETS,
    ROUTING,
    STORED,
    UNKNOWN,
    Shelf,
    SourceCache,
)

# The prefix tree keeps every block ever stored up to this many; past it, the
# oldest leaves no source holds any more are forgotten (counts above them stay).
MAX_TREE_NODES = 2_000_000
PREFIX_REFRESH_S = 2.0  # the ranking of shared prefixes is refreshed at most this often


def _bits(mask: int) -> str:
    return ",".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1)


class WatchFold:
    """Every source's cache, the fleet's holders and the prefix trees of one run.

    The usual events (a prefill's new blocks; blocks held once, removed) are folded
    with a few dict and set operations per event, not several per block; anything
    else (re-announced hits, second copies, several shelves) block by block.
    """

    def __init__(self, run_id: int, origin_ns: int) -> None:
        self.run_id = run_id
        self.origin_ns = origin_ns
        self.sources: dict[int, SourceCache] = {}
        self.trees: dict[str, PrefixTree] = {}
        self.memory = RemovalMemory()
        self.applied_rowid = 0
        # deltas since the last write: (width, bucket, source, medium) -> [stored,
        # removed, live, recomputed, routing, new, both]; live is the value at the last event
        self._series: dict[tuple, list[int]] = {}
        # (width, bucket, engine) -> [duplicated, extra, peak]
        self._fleet_series: dict[tuple, list[int]] = {}
        self._prefixes_at = 0.0
        # (source, medium) -> _note_entries' last answer; reset with the dicts above
        self._note_at: dict[tuple, tuple] = {}

    # --- sources ------------------------------------------------------------------------

    def _tree(self, engine: str) -> PrefixTree:
        tree = self.trees.get(engine)
        if tree is None:
            tree = self.trees[engine] = PrefixTree()
        return tree

    def add_source(self, index: int, engine: str | None) -> None:
        src = self.sources.get(index)
        if src is None:
            src = self.sources[index] = SourceCache(index, engine or "", self._tree(engine or ""))
        elif engine and src.engine != engine and not src.shelves:
            del src.tree.by_bit[src.bit]
            src.engine, src.tree = engine, self._tree(engine)
        src.tree.by_bit[src.bit] = src

    def _source(self, index: int) -> SourceCache:
        src = self.sources.get(index)
        if src is None:
            self.add_source(index, "")
            src = self.sources[index]
        return src

    # --- events -------------------------------------------------------------------------

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
        # timestamp and medium (a batch's events, mostly): sums over the run, the
        # values at its end. The fleet's peak is the highest of those ends: the events
        # of one engine step are published at once, and the order they come in within
        # it is no moment the fleet was in.
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

    def _note(self, src: SourceCache, source: int, medium: str, ts_ns: int,
              run: list[int]) -> None:  # fmt: skip
        """A run's figures into the series of each bucket width: ``run`` (stored,
        removed, recomputed, routing, new, both) added, live blocks and the fleet's
        duplication as they are now (the peak: the highest of these)."""
        tree = src.tree
        dup, extra = tree.duplicated, tree.extra
        if extra > tree.peak:
            tree.peak = extra
        rel = ts_ns - self.origin_ns
        # Consecutive runs of a source mostly fall in the same second, hence in the
        # same bucket of every (wider, multiple) width: their entries are kept at hand.
        cached = self._note_at.get((source, medium))
        if cached is None or cached[0] != rel // 1_000_000_000:
            cached = self._note_entries(src, source, medium, rel)
        _, s1, s2, s3, f1, f2, f3 = cached
        stored, removed, recomputed, routing, new, both = run
        counts = src.counts
        counts[STORED] += stored
        counts[REMOVED] += removed
        counts[NEW] += new
        counts[RECOMPUTED] += recomputed
        counts[ROUTING] += routing
        counts[BOTH] += both
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

    def _note_entries(self, src: SourceCache, source: int, medium: str, rel: int) -> tuple:
        """(1 s bucket, the series entries, the fleet entries) of ``rel`` in each width,
        made where missing."""
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
                tree = src.tree  # peak starts at the first value
                entry = fleet[(w, b, src.engine)] = [tree.duplicated, tree.extra, tree.extra]
            fleets.append(entry)
        cached = self._note_at[(source, medium)] = (rel // 1_000_000_000, *mine, *fleets)
        return cached

    def _store(self, src: SourceCache, ts_ns: int, hashes: list[int], parent: int | None,
               m: str, g: int, run: list[int]) -> None:  # fmt: skip
        """Fold a BlockStored in (its figures into ``run``)."""
        shelf = src.shelves.get((m, g))
        if shelf is None:
            shelf = src.shelf(m, g)
        born = shelf.born
        n = len(hashes)
        tree, bit = src.tree, src.bit
        if n == 1 and src.on_source is None and hashes[0] not in born:
            self._store_one(src, shelf, ts_ns, hashes[0], parent, run)
            return
        one_shelf = src.on_source is None
        # New content (a prompt's prefill): blocks the prefix tree has never seen, so
        # neither this shelf nor any source holds one (a block held anywhere is in the
        # tree: it forgets only blocks held nowhere).
        if one_shelf and tree.nodes.keys().isdisjoint(hashes):
            before = len(born)
            born.update(zip(hashes, repeat(ts_ns)))
            if len(born) - before == n:
                shelf.copies += n
                recomputed = 0
                evicted = src.evicted
                if evicted and not evicted.keys().isdisjoint(hashes):  # removed, then pruned
                    pop = evicted.pop
                    back = [at for at in map(pop, hashes, repeat(None)) if at is not None]
                    src.hist["restore_gap"] += map(sub, repeat(ts_ns), back)
                    recomputed = len(back)
                run[0] += n
                run[2] += recomputed
                run[4] += n
                tree.new_chain(hashes, parent, bit)
                return
            for h in hashes:  # a hash twice in the event: undone, and taken block by block
                born.pop(h, None)
        # The usual event: blocks no shelf of a one-shelf source holds, none twice in
        # the event: the cache, the evicted memory and the holders a few dict calls.
        elif one_shelf and (not born or born.keys().isdisjoint(hashes)):
            before = len(born)
            born.update(zip(hashes, repeat(ts_ns)))
            if len(born) - before == n:
                shelf.copies += n
                evicted = src.evicted
                back: set[int] = set()
                if evicted and not evicted.keys().isdisjoint(hashes):
                    back = {h for h in hashes if h in evicted}
                    restore = src.hist["restore_gap"]
                    for h in back:
                        restore.append(ts_ns - evicted.pop(h))
                # the fleet's holders of blocks other sources stored: kept as it grows
                routing, both = tree.grow(hashes, parent, bit, distinct=True, back=back)
                run[0] += n
                run[2] += len(back)
                run[3] += routing
                run[4] += n
                run[5] += both
                return
            for h in hashes:
                born.pop(h, None)
        self._store_blocks(src, shelf, ts_ns, hashes, run)
        tree.grow(hashes, parent, bit, back=None)

    def _store_one(self, src: SourceCache, shelf: Shelf, ts_ns: int, block: int,
                   parent: int | None, run: list[int]) -> None:  # fmt: skip
        """One new block on a one-shelf source (decode-like streams)."""
        shelf.born[block] = ts_ns
        shelf.copies += 1
        run[0] += 1
        run[4] += 1
        evicted = src.evicted
        removed_at = evicted.pop(block, None) if evicted else None
        if removed_at is not None:
            run[2] += 1
            src.hist["restore_gap"].append(ts_ns - removed_at)
        tree, bit = src.tree, src.bit
        node = tree.nodes.get(block)
        if node is None:
            tree.add_leaf(block, parent if parent != block else None, bit)
            return
        if node.__class__ is Chain:
            node = tree.unchain(node, block)
        stored_by = node.bits
        if stored_by != bit:  # another source stored it: the fleet keeps its holders
            if tree.add_holder(block, stored_by, bit):
                run[3] += 1  # another source of this engine kind holds it
                if removed_at is not None:
                    run[5] += 1
            node.bits = stored_by | bit

    def _store_blocks(self, src: SourceCache, shelf: Shelf, ts_ns: int, hashes: list[int],
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
                # Stored while held here: a hit re-announced when in a later batch than
                # the store that made it held; in the same batch, two requests computed
                # it at once, and it is a second physical copy.
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
                k = on_source.get(block, 0)
                on_source[block] = k + 1
                if k:
                    continue  # on another medium or group of this source already
            new += 1
            removed_at = evicted.pop(block, None) if evicted else None
            if removed_at is not None:
                recomputed += 1
                restore.append(ts_ns - removed_at)
            stored_by = tree.stored_by(block)  # its node's bits: grow adds ours after
            if stored_by and stored_by != bit and tree.add_holder(block, stored_by, bit):
                routing += 1  # another source of this engine kind holds it
                if removed_at is not None:
                    both += 1
        shelf.copies += copies
        counts[REANNOUNCED] += reannounced
        run[0] += len(hashes)
        run[2] += recomputed
        run[3] += routing
        run[4] += new
        run[5] += both

    def _remove(self, src: SourceCache, ts_ns: int, hashes: list[int], m: str, g: int,
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
            block = hashes[0]
            stored_at = born.get(block)
            if stored_at is not None and not (shelf.more and block in shelf.more):
                # One block held once (decode-like streams): as below, without the calls.
                del born[block]
                shelf.copies -= 1
                life = ts_ns - stored_at
                hist = src.hist
                hist["lifetime"].append(life)
                last = shelf.last
                hist["idle_before_evict"].append(
                    ts_ns - last.pop(block, stored_at) if last else life
                )
                counts[LIFE_COUNT] += 1
                counts[LIFE_SUM] += life / 1e9
                src.evicted[block] = ts_ns
                self.memory.add_one(src, ts_ns, block)
                if src.tree.held:
                    src.tree.release(block, src.bit)
                return
        # The usual event: one copy of each, held on a one-shelf source. Popped without a
        # look first: a hash not held (or twice in the event) pops None, and what was
        # popped is put back for the block-by-block path.
        if src.on_source is None and (not shelf.more or shelf.more.keys().isdisjoint(hashes)):
            births = list(map(born.pop, hashes, repeat(None, n)))
            if None not in births:
                shelf.copies -= n
                last = shelf.last
                if last and not last.keys().isdisjoint(hashes):
                    hist = src.hist
                    hist["lifetime"] += map(sub, repeat(ts_ns, n), births)
                    hist["idle_before_evict"] += [
                        ts_ns - last.pop(h, b) for h, b in zip(hashes, births, strict=True)
                    ]
                else:
                    # lifetime = idle before evict = ts_ns - birth, binned at the write
                    src.spans.append((ts_ns, births))
                counts[LIFE_COUNT] += n
                counts[LIFE_SUM] += (n * ts_ns - sum(births)) / 1e9
                src.evicted.update(zip(hashes, repeat(ts_ns)))
                self.memory.add(src, ts_ns, hashes, own=False)  # the event's list, kept
                tree = src.tree
                held = tree.held  # only blocks other sources stored too are in it
                if held and not held.keys().isdisjoint(hashes):
                    bit = src.bit
                    for h in hashes:
                        tree.release(h, bit)
                return
            # a hash not held, or twice in the event: put back, and taken block by block
            born.update((h, b) for h, b in zip(hashes, births, strict=True) if b is not None)
        self._remove_blocks(src, shelf, ts_ns, hashes)

    def _remove_blocks(self, src: SourceCache, shelf: Shelf, ts_ns: int,
                       hashes: list[int]) -> None:  # fmt: skip
        """``_remove`` block by block: anything but the usual event."""
        born, last, more = shelf.born, shelf.last, shelf.more
        on_source, counts, evicted = src.on_source, src.counts, src.evicted
        lifetimes, idle = src.hist["lifetime"], src.hist["idle_before_evict"]
        tree, bit = src.tree, src.bit
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
            tree.release(block, bit)  # the fleet: this source no longer holds it
        shelf.copies -= copies
        counts[UNKNOWN] += unknown
        counts[LIFE_COUNT] += lives
        counts[LIFE_SUM] += life_ns / 1e9
        if remembered:
            self.memory.add(src, ts_ns, remembered, own=True)

    def _clear(self, src: SourceCache, source: int, ts_ns: int, op: int) -> None:
        src.counts[CLEARS if op == OP_CLEARED else RESETS] += 1
        tree, bit = src.tree, src.bit
        if tree.held:
            for block in src.all_held():
                tree.release(block, bit)
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
        out = [
            (engine, h, node.depth, node.children, node.subtree, node.bits)
            for engine, tree in self.trees.items()
            for h, node in tree.top_prefixes(top)
        ]
        out.sort(key=lambda p: (p[2] * (p[3] - 1), p[4]), reverse=True)
        return out[:top]

    def check_integrity(self) -> None:
        """Every tree's bookkeeping against itself and the sources' shelves, and each
        source's shelves against their copy counts (AssertionError where they differ)."""
        for tree in self.trees.values():
            tree.check_integrity()
        for index, src in self.sources.items():
            for key, shelf in src.shelves.items():
                expected = len(shelf.born) + sum(shelf.more.values())
                assert shelf.copies == expected, f"source {index} {key}: copies"
            if src.on_source is not None:
                counted: dict[int, int] = {}
                for shelf in src.shelves.values():
                    for h in shelf.born:
                        counted[h] = counted.get(h, 0) + 1
                assert counted == src.on_source, f"source {index}: shelves per hash"
        assert self.memory.remembered <= self.memory.bound, "removals remembered past the bound"

    def changes(self, *, final: bool = False) -> AggregateRows:
        """What changed since the last call, as rows for ``db.watch_aggregates``; the
        deltas are handed over (and start again from zero here)."""
        self._note_at = {}  # its entries belong to the dicts handed over below
        for tree in self.trees.values():
            if len(tree.nodes) > MAX_TREE_NODES:
                tree.prune(len(tree.nodes) - MAX_TREE_NODES * 9 // 10)
        rows = AggregateRows(self.applied_rowid)
        rows.stats = [(i, *s.counts, s.forgotten) for i, s in self.sources.items()]
        rows.live = [
            (i, m, g, len(shelf.born), shelf.copies)
            for i, s in self.sources.items()
            for (m, g), shelf in s.shelves.items()
        ]
        rows.series = [(*k, *v) for k, v in self._series.items()]
        self._series = {}
        rows.fleet_series = [(*k, *v) for k, v in self._fleet_series.items()]
        self._fleet_series = {}
        rows.histograms = histogram_rows(self.sources)
        rows.fleet = [
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
        ]
        now = time.monotonic()
        dirty = any(t.dirty for t in self.trees.values())
        if dirty and (final or now - self._prefixes_at >= PREFIX_REFRESH_S):
            self._prefixes_at = now
            for tree in self.trees.values():
                tree.dirty = False
            rows.shared_prefixes = [
                (rank, e, h, depth, branches, subtree, _bits(mask))
                for rank, (e, h, depth, branches, subtree, mask) in enumerate(self.top_prefixes())
            ]
        return rows
