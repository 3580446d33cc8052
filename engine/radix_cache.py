"""The prefix cache: a radix tree over token ids at page granularity.

Each node is one full page of ``page_size`` tokens; its path from the root is
the token prefix it completes (SGLang's RadixAttention idea, with the page as
the unit so a hit maps straight onto the page table). The cache holds one
pool reference on every device page it stores; a request that matches a
prefix takes its own reference, so a page is evictable exactly when its
reference count is 1 (only the cache holds it) and no child page is still on
the device (children continue their parent's positions).

Only full pages are shared, and shared pages are never written: a request's
new tokens always go to pages it allocated itself, and a partially filled last
page is recomputed, never shared. Evicted pages are either dropped (and later
recomputed) or moved to the host tier and reloaded on a hit.

Contract: ``match(tokens)`` -> (pages, hit tokens) with references taken;
``insert(tokens, pages)`` stores full pages; ``evict(n)`` frees up to n device
pages; ``check_integrity()`` asserts every invariant.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBus,
    PageEvicted,
    PageOffloaded,
    PageReloaded,
    now_ns,
)
from engine.eviction import LRU
from engine.host_tier import HostTier
from engine.page_pool import OutOfPages, PagePool


@dataclass(eq=False, slots=True)
class Node:
    key: tuple[int, ...]
    parent: Node | None
    page: int | None = None  # device page, or None when offloaded
    host_slot: int | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    last_access: int = 0
    hits: int = 0
    created: int = 0

    @property
    def on_device(self) -> bool:
        return self.page is not None


class RadixCache:
    def __init__(
        self,
        pool: PagePool,
        bus: EventBus,
        policy=None,
        host: HostTier | None = None,
        should_offload: Callable[[], bool] = lambda: False,
    ) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.bus = bus
        self.policy = policy or LRU()
        self.host = host
        self.should_offload = should_offload
        self.root = Node(key=(), parent=None)
        self._clock = itertools.count(1)
        self.step = 0
        self.device_pages = 0  # nodes whose page is on the device
        self.host_pages = 0
        self.evicted_since_snapshot: set[int] = set()

    # --- lookups ---------------------------------------------------------------

    def _blocks(self, tokens: list[int], limit: int) -> list[tuple[int, ...]]:
        ps = self.page_size
        return [tuple(tokens[i : i + ps]) for i in range(0, limit - limit % ps, ps)]

    def match(self, tokens: list[int]) -> tuple[list[int], int]:
        """Longest cached prefix of ``tokens`` that leaves at least one token to compute.

        Returns its device pages (one reference each taken for the caller,
        offloaded pages reloaded first) and the number of tokens they hold.
        """
        limit = len(tokens) - 1
        node = self.root
        pages: list[int] = []
        tick = next(self._clock)
        for key in self._blocks(tokens, limit):
            child = node.children.get(key)
            if child is None:
                break
            if not child.on_device and not self._reload(child):
                break
            # Take the caller's reference now, so reloading the next page cannot evict this one.
            self.pool.incref([child.page])
            child.last_access = tick
            child.hits += 1
            pages.append(child.page)
            node = child
        return pages, len(pages) * self.page_size

    def _reload(self, node: Node) -> bool:
        if self.pool.num_free == 0 and not self.evict(1, protect=node):
            return False
        [page] = self.pool.allocate(1)
        slot = node.host_slot
        seconds = self.host.load(slot, page)
        node.page, node.host_slot = page, None
        self.device_pages += 1
        self.host_pages -= 1
        self.evicted_since_snapshot.discard(page)
        if self.bus.active:
            self.bus.emit(PageReloaded(now_ns(), self.step, page, slot, seconds))
        return True

    # --- inserts ---------------------------------------------------------------

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        start_node: Node | None = None,
        start_page: int = 0,
    ) -> Node:
        """Store the full pages of ``tokens`` (held in ``pages``); returns the deepest node.

        ``start_node``/``start_page`` let a running request continue where its
        previous insert stopped instead of walking from the root.
        """
        if start_node is None or (start_node is not self.root and start_node.parent is None):
            start_node, start_page = self.root, 0  # first insert, or the old path was dropped
        node = start_node
        stored: list[int] = []
        tick = next(self._clock)
        blocks = self._blocks(tokens, len(tokens))
        for i in range(start_page, len(blocks)):
            key = blocks[i]
            child = node.children.get(key)
            if child is None:
                child = Node(key=key, parent=node, page=pages[i], created=tick)
                node.children[key] = child
                self.pool.incref([pages[i]])
                self.device_pages += 1
                stored.append(pages[i])
            elif not child.on_device:
                # Adopt the request's copy instead of reloading the offloaded one.
                self.host.release(child.host_slot)
                child.page, child.host_slot = pages[i], None
                self.pool.incref([pages[i]])
                self.device_pages += 1
                self.host_pages -= 1
                stored.append(pages[i])
            child.last_access = tick
            node = child
        if stored and self.bus.active:
            self.bus.emit(
                BlockStored(now_ns(), self.step, tuple(stored), len(stored) * self.page_size)
            )
        return node

    # --- eviction ----------------------------------------------------------------

    def _evictable(self, protect: Node | None) -> list[Node]:
        out = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if (
                node.on_device
                and self.pool.refcount[node.page] == 1
                and node is not protect
                and not any(c.on_device for c in node.children.values())
            ):
                out.append(node)
        return out

    @property
    def num_evictable(self) -> int:
        return len(self._evictable(None))

    def evict(self, n: int, protect: Node | None = None) -> int:
        """Free up to ``n`` device pages held only by the cache; returns how many were freed."""
        freed = 0
        while freed < n:
            candidates = self._evictable(protect)
            if not candidates:
                break
            candidates.sort(key=self.policy.priority)
            for node in candidates[: n - freed]:
                self._evict_node(node)
                freed += 1
        return freed

    def _evict_node(self, node: Node) -> None:
        page = node.page
        offload = self.host is not None and self.should_offload() and self.host.num_free > 0
        emit = self.bus.active
        if offload:
            slot, seconds = self.host.store(page)
            node.page, node.host_slot = None, slot
            self.host_pages += 1
            if emit:
                self.bus.emit(PageEvicted(now_ns(), self.step, page, "offloaded", self.policy.name))
                self.bus.emit(PageOffloaded(now_ns(), self.step, page, slot, seconds))
        else:
            removed = self._drop_subtree(node)
            if emit:
                self.bus.emit(PageEvicted(now_ns(), self.step, page, "dropped", self.policy.name))
                self.bus.emit(BlockRemoved(now_ns(), self.step, tuple(removed)))
            node.page = None
        self.device_pages -= 1
        self.pool.decref([page])
        self.evicted_since_snapshot.add(page)

    def _drop_subtree(self, node: Node) -> list[int]:
        """Unlink ``node``; its descendants (all offloaded) lose their host slots."""
        del node.parent.children[node.key]
        node.parent = None  # detached: a request continuing from here restarts at the root
        removed = [node.page]
        stack = list(node.children.values())
        while stack:
            child = stack.pop()
            child.parent = None
            stack.extend(child.children.values())
            assert not child.on_device, "dropping a node whose child is on the device"
            self.host.release(child.host_slot)
            self.host_pages -= 1
        return removed

    def clear(self) -> None:
        """Drop every cached page not held by a running request (AllBlocksCleared)."""
        while self.evict(self.pool.num_pages):
            pass
        if self.bus.active:
            self.bus.emit(AllBlocksCleared(now_ns(), self.step))

    # --- introspection ---------------------------------------------------------------

    def nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def cached_only_pages(self) -> list[int]:
        return [n.page for n in self.nodes() if n.on_device and self.pool.refcount[n.page] == 1]

    def check_integrity(self) -> None:
        nodes = self.nodes()
        device = [n.page for n in nodes if n.on_device]
        assert len(device) == len(set(device)), "a device page stored in two nodes"
        assert len(device) == self.device_pages, "device page count drifted"
        for n in nodes:
            assert (n.page is None) != (n.host_slot is None), (
                "node both or neither on device and host"
            )
            assert len(n.key) == self.page_size
            assert n.parent.children.get(n.key) is n, "broken parent link"
            if n.on_device:
                assert self.pool.refcount[n.page] >= 1, f"cached page {n.page} has no reference"
        slots = self.host_slots()
        assert len(slots) == self.host_pages, "host page count drifted"

    def host_slots(self) -> set[int]:
        return {n.host_slot for n in self.nodes() if not n.on_device}


__all__ = ["Node", "OutOfPages", "RadixCache"]
