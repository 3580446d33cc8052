"""Eviction policies: which unreferenced cached page goes first.

Each policy is one small class behind one method, ``priority(node)``; the
prefix cache keeps its evictable leaves in a heap keyed by that priority and
evicts the smallest first (SGLang's evict_policy.py shape). A priority may
only change when the cache touches the node (a match or an insert), so the
cache can re-key the heap right there instead of re-sorting on every pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol


class CacheNode(Protocol):
    last_access: int
    hits: int
    created: int
    next_use: int


class EvictionPolicy(ABC):
    """Orders evictable nodes: the smallest ``priority`` is evicted first."""

    name: ClassVar[str]

    @abstractmethod
    def priority(self, node: CacheNode) -> tuple[int, ...]: ...


class LRU(EvictionPolicy):
    """Least recently used: oldest last access first."""

    name = "lru"

    def priority(self, node: CacheNode) -> tuple[int, ...]:
        return (node.last_access,)


class LFU(EvictionPolicy):
    """Least frequently used: fewest hits first, ties by recency."""

    name = "lfu"

    def priority(self, node: CacheNode) -> tuple[int, ...]:
        return (node.hits, node.last_access)


class FIFO(EvictionPolicy):
    """First in, first out: oldest insertion first, whatever its use."""

    name = "fifo"

    def priority(self, node: CacheNode) -> tuple[int, ...]:
        return (node.created,)


class Belady(EvictionPolicy):
    """The offline optimum (Belady's MIN): the page needed furthest in the future goes first.

    Only a replay knows the future: it stamps each page's ``next_use`` (the
    index of the next request that needs that content) whenever the cache
    touches it (engine/replay). No online policy beats it at the same
    capacity, so it bounds what a smarter policy could win. Ties (content
    never needed again) go least recently used first.
    """

    name = "belady"

    def priority(self, node: CacheNode) -> tuple[int, ...]:
        return (-node.next_use, node.last_access)


POLICIES: dict[str, type[EvictionPolicy]] = {cls.name: cls for cls in (LRU, LFU, FIFO, Belady)}
# Policies an online engine can run (belady needs the future, which only a replay has).
ONLINE_POLICIES = ("lru", "lfu", "fifo")


def make_policy(name: str) -> EvictionPolicy:
    return POLICIES[name]()
