"""One source's cache as its event stream tells it: what each shelf holds, and the
removals the source still remembers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvscope.db.watch_aggregates import HISTOGRAMS, STAT_COLUMNS

if TYPE_CHECKING:
    from kvscope.profiler.watch.fold.prefix_tree import PrefixTree

# Indexes of STAT_COLUMNS in a source's counts.
STORED, NEW, REMOVED, REANNOUNCED, RECOMPUTED, ROUTING, BOTH, UNKNOWN = range(8)
CLEARS, RESETS, LIFE_COUNT, LIFE_SUM = range(8, 12)


class Shelf:
    """What one source holds on one (medium, group): copies per hash.

    Ints in dicts, no object per block: ``born`` is every hash held and when it
    was stored (ns), ``last`` the latest re-store of those stored again, ``more``
    the copies beyond the first of those held twice or more (rare)."""

    __slots__ = ("born", "last", "more", "copies")

    def __init__(self) -> None:
        self.born: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.more: dict[int, int] = {}
        self.copies = 0  # physical copies on the shelf


_NOTHING_HELD: dict[int, int] = {}  # all_held() of a source with no shelf yet (never written)


class SourceCache:
    """One source: its shelves, its remembered removals, its counts and the
    durations its histograms take at the next write."""

    __slots__ = ("bit", "engine", "tree", "shelves", "on_source", "evicted", "forgotten",
                 "counts", "hist", "spans")  # fmt: skip

    def __init__(self, index: int, engine: str, tree: PrefixTree) -> None:
        self.bit = 1 << index  # the source in a prefix tree's holder masks
        self.engine = engine
        self.tree = tree
        self.shelves: dict[tuple[str, int], Shelf] = {}  # (medium, group) -> shelf
        # hash -> shelves holding it; kept only once a source has two shelves (an
        # offload tier, hybrid groups): with one, held there is held on the source.
        self.on_source: dict[int, int] | None = None
        # hash -> removed at (ns), while the removal is among the fleet's remembered
        # ones (RemovalMemory says which are oldest; this dict's order means nothing)
        self.evicted: dict[int, int] = {}
        self.forgotten = 0  # removals let go of by RemovalMemory, never re-stored by then
        self.counts: list = [0] * len(STAT_COLUMNS)  # STAT_COLUMNS order; lifetime_sum_s in s
        self.counts[LIFE_SUM] = 0.0
        # durations (ns) per histogram since the last write, binned then (numpy)
        self.hist: dict[str, list[int]] = {name: [] for name in HISTOGRAMS}
        # (removed at, [stored at, ...]) of the usual removal event since the last
        # write: its blocks' lifetimes, which are also their idle times before
        # eviction (none was re-announced), subtracted and binned at the write
        self.spans: list[tuple[int, list[int]]] = []

    def shelf(self, medium: str, group: int) -> Shelf:
        key = (medium, group)
        shelf = self.shelves.get(key)
        if shelf is None:
            if len(self.shelves) == 1 and self.on_source is None:
                (only,) = self.shelves.values()
                self.on_source = dict.fromkeys(only.born, 1)
            shelf = self.shelves[key] = Shelf()
        return shelf

    def held_blocks(self, medium: str) -> int:
        if len(self.shelves) == 1:
            (((m, _), shelf),) = self.shelves.items()
            return len(shelf.born) if m == medium else 0
        return sum(len(s.born) for (m, _), s in self.shelves.items() if m == medium)

    def all_held(self) -> dict[int, int]:
        """Every hash the source holds on some shelf (as a dict's keys)."""
        if self.on_source is not None:
            return self.on_source
        return next(iter(self.shelves.values())).born if self.shelves else _NOTHING_HELD
