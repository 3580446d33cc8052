"""Eviction policies: which unreferenced cached page goes first.

Each policy is one small class with one method, ``priority(node)``; the cache
evicts the evictable node with the smallest priority (SGLang's
evict_policy.py shape).
"""

from __future__ import annotations

from typing import Protocol


class CacheNode(Protocol):
    last_access: int
    hits: int
    created: int


class LRU:
    """Least recently used: oldest last access first."""

    name = "lru"

    def priority(self, node: CacheNode) -> tuple[int, ...]:
        return (node.last_access,)


class LFU:
    """Least frequently used: fewest hits first, ties by recency."""

    name = "lfu"

    def priority(self, node: CacheNode) -> tuple[int, ...]:
        return (node.hits, node.last_access)


class FIFO:
    """First in, first out: oldest insertion first, whatever its use."""

    name = "fifo"

    def priority(self, node: CacheNode) -> tuple[int, ...]:
        return (node.created,)


POLICIES = {cls.name: cls for cls in (LRU, LFU, FIFO)}


def make_policy(name: str) -> LRU | LFU | FIFO:
    return POLICIES[name]()
