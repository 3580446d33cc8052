"""The fleet's bounded memory of removed blocks, by which a block stored again on the
source that removed it is told apart from new prefill (recomputation after
eviction)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.profiler.watch.fold.source_cache import SourceCache

# Removals the fleet remembers, all sources together: the newest this many, the oldest
# forgotten first. A fleet budget, not one per source (1M per source had let 64 sources
# hold 64M, ~10 GB). At about 110 bytes each (a dict entry and a share of the ring's
# lists) that is about 220 MB at the bound, and at 570 removals/s (8 busy ranks) the
# last hour.
EVICTED_MEMORY = 2_000_000


class RemovalMemory:
    """Which removals are oldest, fleet-wide. Each source keeps its own ``evicted``
    (hash -> removed at); this ring says in what order they are let go of, an entry
    per removal event (or per batch of one-hash removals) rather than per hash. A
    hash whose source no longer says that time (re-stored, removed again, cleared)
    is stale in the ring and forgets nothing."""

    __slots__ = ("ring", "remembered", "bound")

    def __init__(self, bound: int | None = None) -> None:
        # (source, removed at, hashes, whether the list is the ring's own: a batch's
        # one-hash removals share one)
        self.ring: deque[tuple[SourceCache, int, list[int], bool]] = deque()
        self.remembered = 0  # hashes in the ring, stale ones included
        self.bound = EVICTED_MEMORY if bound is None else bound

    def add(self, src: SourceCache, ts_ns: int, hashes: list[int], *, own: bool) -> None:
        """``hashes``, just put in ``src.evicted`` at ``ts_ns``; ``own``: the list is
        the ring's to extend (else an event's, kept as it is)."""
        self.ring.append((src, ts_ns, hashes, own))
        self.remembered += len(hashes)
        if self.remembered > self.bound:
            self.forget()

    def add_one(self, src: SourceCache, ts_ns: int, block: int) -> None:
        """One hash: into the last entry when it is the same source's, at the same
        time, and the ring's own list (a batch's one-hash removals)."""
        ring = self.ring
        tail = ring[-1] if ring else None
        if tail is not None and tail[3] and tail[0] is src and tail[1] == ts_ns:
            tail[2].append(block)
        else:
            ring.append((src, ts_ns, [block], True))
        self.remembered += 1
        if self.remembered > self.bound:
            self.forget()

    def forget(self) -> None:
        """Let go of the oldest remembered removals past the bound."""
        ring = self.ring
        over = self.remembered - self.bound
        while over > 0 and ring:
            src, ts_ns, hashes, _ = ring.popleft()
            n = len(hashes)
            if n > over:  # the newer part of the entry stays remembered
                ring.appendleft((src, ts_ns, hashes[over:], True))
                hashes = hashes[:over]
                n = over
            over -= n
            self.remembered -= n
            evicted = src.evicted
            if not evicted:
                continue
            # Popped without a look first (a hash removed twice in one event is in the
            # entry twice: its second pop finds None); what was popped that is not this
            # removal's (stale here: removed again since) goes back.
            popped = list(map(evicted.pop, hashes, [None] * n))
            mine = popped.count(ts_ns)
            src.forgotten += mine
            if mine + popped.count(None) != n:
                for h, at in zip(hashes, popped, strict=True):
                    if at is not None and at != ts_ns:
                        evicted[h] = at
