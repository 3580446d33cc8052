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

Content comes either as a list of token ids (the live engine: a page's key is
the tuple of its tokens) or as a page-keyed sequence (the trace replay,
engine/replay/tokens.py: ``page_keys`` gives each page's key directly, so a
page of a production trace costs O(1), not ``page_size`` Python ints; its
``next_use`` feeds the offline-optimal policy).

Nothing here walks the tree or the pool per step. The evictable leaves are a
set kept exact at every change (match, insert, release, evict, offload,
reload), mirrored in a heap keyed by the eviction policy with lazy deletion:
an entry is live while its node is evictable and its stamp is the node's
latest, so evicting k pages costs O(k log n) whatever the tree's size.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np

from kvscope.engine.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBus,
    PageEvicted,
    PageOffloaded,
    PageReloaded,
    now_ns,
)
from kvscope.engine.eviction import LRU, EvictionPolicy
from kvscope.engine.host_tier import HostTier
from kvscope.engine.miss_reasons import ROOT_CHAIN, MissReasons, MissSplit, chain_hash
from kvscope.engine.page_pool import PagePool
from kvscope.engine.prefix_cache import PrefixCache


@dataclass(eq=False, slots=True)
class Node:
    key: Hashable  # the page's token tuple, or a replay's page key
    parent: Node | None
    page: int | None = None  # device page, or None when offloaded
    host_slot: int | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    last_access: int = 0
    hits: int = 0
    created: int = 0
    device_children: int = 0  # children whose page is on the device
    queued: tuple[int, ...] | None = None  # priority of the live heap entry, if evictable
    stamp: int = 0  # the live heap entry's stamp; older entries of this node are stale
    next_use: int = 0  # when this content is next needed (replays only: belady's key)
    chain: int = ROOT_CHAIN  # hash of the whole prefix this page completes (miss reasons)

    @property
    def on_device(self) -> bool:
        return self.page is not None


@dataclass(slots=True)
class CacheWork:
    """Operation counts, so tests can show per-step work does not grow with the pool."""

    nodes: int = 0  # tree nodes visited
    heap: int = 0  # heap pushes, pops and entries rebuilt


class RadixCache(PrefixCache):
    def __init__(
        self,
        pool: PagePool,
        bus: EventBus,
        policy: EvictionPolicy | None = None,
        host: HostTier | None = None,
        should_offload: Callable[[], bool] = lambda: False,
    ) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.bus = bus
        self._policy = policy or LRU()
        self.host = host
        self.should_offload = should_offload
        self.root = Node(key=(), parent=None)
        self._clock = itertools.count(1)
        self._stamps = itertools.count(1)
        self.step = 0
        self.host_pages = 0
        self.evictions = 0  # pages evicted (dropped or offloaded) since the start
        self.work = CacheWork()
        self._by_page: dict[int, Node] = {}  # every device page the cache holds
        # Of those, the pages no request holds: a flag per page (bytearray indexing is
        # as cheap as a set's, and numpy reads it without a copy for page maps).
        self._cache_only = bytearray(pool.num_pages)
        self._num_cached_only = 0
        self._evictable: set[Node] = set()  # cache-only nodes with no child on the device
        self._heap: list[tuple[tuple[int, ...], int, Node]] = []
        self._evicted: set[int] = set()
        # Pages evicted in the current step -> the last eviction's action (the KV
        # manager clears it when a step starts): the "evicted this step" page state.
        self.evicted_step: dict[int, str] = {}
        # Why admissions miss (engine/miss_reasons.py): fed the chain hash of every dropped page.
        self.misses = MissReasons(self.page_size)

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: EvictionPolicy) -> None:
        """A new policy re-keys the whole heap (rare: O(evictable))."""
        self._policy = policy
        for node in self._evictable:
            node.queued = None
        self._rebuild_heap()

    @property
    def device_pages(self) -> int:
        return len(self._by_page)

    @property
    def num_cached_only(self) -> int:
        return self._num_cached_only

    # --- the evictable set and its heap ------------------------------------------------

    def _refresh(self, node: Node) -> None:
        """Bring ``node``'s cache-only and evictable membership up to date (O(log n)).

        The hot path of a replay (several calls per page): a node is in the
        evictable set exactly when ``queued`` is set, so the set is only
        touched when membership changes.
        """
        page = node.page
        if page is None or node is self.root:
            return
        cache_only = self._cache_only
        if self.pool.refcount[page] != 1:
            if cache_only[page]:
                cache_only[page] = 0
                self._num_cached_only -= 1
            if node.queued is not None:
                self._evictable.discard(node)
                node.queued = None
            return
        if not cache_only[page]:
            cache_only[page] = 1
            self._num_cached_only += 1
        if node.device_children:
            if node.queued is not None:
                self._evictable.discard(node)
                node.queued = None
            return
        priority = self._policy.priority(node)
        if node.queued != priority:  # newly evictable, or re-keyed by an access
            self._evictable.add(node)
            node.queued, node.stamp = priority, next(self._stamps)
            heapq.heappush(self._heap, (priority, node.stamp, node))
            self.work.heap += 1
            if len(self._heap) > 2 * len(self._evictable) + 64:
                self._rebuild_heap()  # stale entries outnumber live ones: amortised O(1)

    def _set_cache_only(self, page: int, flag: int) -> None:
        if self._cache_only[page] != flag:
            self._cache_only[page] = flag
            self._num_cached_only += 1 if flag else -1

    def _rebuild_heap(self) -> None:
        for node in self._evictable:
            if node.queued is None:
                node.queued, node.stamp = self._policy.priority(node), next(self._stamps)
        # In place: ``evict`` holds the list while an eviction's refresh may rebuild it.
        self._heap[:] = [(n.queued, n.stamp, n) for n in self._evictable]
        heapq.heapify(self._heap)
        self.work.heap += len(self._heap)

    def _attach(self, node: Node, page: int) -> None:
        """``node`` now holds device ``page`` (the caller took the cache's reference)."""
        node.page, node.host_slot = page, None
        self._by_page[page] = node
        parent = node.parent
        parent.device_children += 1
        if parent.device_children == 1:
            self._refresh(parent)  # no longer a leaf on the device

    def _detach(self, node: Node) -> int:
        """``node`` gives up its device page (the caller drops the reference); returns it."""
        page = node.page
        del self._by_page[page]
        self._set_cache_only(page, 0)
        self._evictable.discard(node)
        node.page, node.queued = None, None
        node.parent.device_children -= 1
        return page

    # --- lookups ---------------------------------------------------------------

    def _blocks(self, tokens: list[int], limit: int, start: int = 0) -> Iterable[Hashable]:
        """Page keys of ``tokens[:limit]`` from page ``start`` on, built as they are walked."""
        ps = self.page_size
        keyed = getattr(tokens, "page_keys", None)
        if keyed is not None:  # page-keyed content: one key per page, no token loop
            return keyed(start, limit // ps)
        return (tuple(tokens[i : i + ps]) for i in range(start * ps, limit - limit % ps, ps))

    def match(self, tokens: list[int]) -> tuple[list[int], int]:
        limit = len(tokens) - 1
        node = self.root
        pages: list[int] = []
        tick = next(self._clock)
        future = getattr(tokens, "next_use", None)
        refcount = self.pool.refcount
        refresh = self._refresh
        for i, key in enumerate(self._blocks(tokens, limit)):
            self.work.nodes += 1
            child = node.children.get(key)
            if child is None:
                break
            if not child.on_device and not self._reload(child):
                break
            # Take the caller's reference now, so reloading the next page cannot evict this one.
            refcount[child.page] += 1  # held by the cache: never a free page
            child.last_access = tick
            child.hits += 1
            if future is not None:
                child.next_use = future(i)
            refresh(child)
            pages.append(child.page)
            node = child
        return pages, len(pages) * self.page_size

    def explain_misses(self, tokens: list[int], hit_pages: list[int]) -> MissSplit:
        """Why the tokens of ``tokens`` past its hit ``hit_pages`` missed (see MissReasons).

        Page-keyed content has tokens to compare only when a token trace is
        replayed (``token_ids``); a hash-id trace's granularity is not measured
        and counts as cold.
        """
        parent = self._by_page[hit_pages[-1]].chain if hit_pages else ROOT_CHAIN
        limit, ps = len(tokens) - 1, self.page_size
        keyed = hasattr(tokens, "page_keys")
        ids = getattr(tokens, "token_ids", None) if keyed else tokens  # a token trace replayed
        tail = (
            None if ids is None or limit % ps == 0 else tuple(ids[limit - limit % ps : limit + 1])
        )
        keys = self._blocks(tokens, limit, len(hit_pages))
        return self.misses.classify(
            keys, len(tokens), len(hit_pages), parent, tail, now_ns(), self.step,
            ids if keyed else None,
        )  # fmt: skip

    def peek(self, tokens: list[int]) -> int:
        """The tokens ``match`` would hit now (offloaded pages count: they reload), with
        no reference taken and no access recorded: a router asks every replica."""
        node, hit = self.root, 0
        for key in self._blocks(tokens, len(tokens) - 1):
            node = node.children.get(key)
            if node is None:
                break
            hit += 1
        return hit * self.page_size

    def release(self, pages: list[int]) -> None:
        self.pool.decref(pages)
        refcount, by_page = self.pool.refcount, self._by_page
        for page in pages:
            if refcount[page] == 1:
                node = by_page.get(page)
                if node is not None:
                    self._refresh(node)

    def _reload(self, node: Node) -> bool:
        # The parent holds the caller's reference, so this eviction cannot take it.
        if self.pool.num_free == 0 and not self.evict(1):
            return False
        [page] = self.pool.allocate(1)
        slot = node.host_slot
        seconds = self.host.load(slot, page)
        self._attach(node, page)
        self.host_pages -= 1
        self._evicted.discard(page)
        if self.bus.active:
            self.bus.emit(PageReloaded(now_ns(), self.step, page, slot, seconds))
        return True

    # --- inserts ---------------------------------------------------------------

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        handle: Node | None = None,
        start_page: int = 0,
    ) -> Node:
        node = handle
        if node is None or (node is not self.root and (node.parent is None or not node.on_device)):
            # First insert; or the old path was dropped, or its end offloaded (new pages
            # must hang under a device page): walk from the root, adopting this request's
            # copies of offloaded pages on the way.
            node, start_page = self.root, 0
        stored: list[int] = []
        copies: list[tuple[int, Node]] = []  # the request's own copy of a block the tree has
        tick = next(self._clock)
        future = getattr(tokens, "next_use", None)
        refcount = self.pool.refcount
        attach, refresh = self._attach, self._refresh  # a replay inserts ~300k pages
        walked = 0
        for i, key in enumerate(self._blocks(tokens, len(tokens), start_page), start_page):
            walked += 1
            child = node.children.get(key)
            if child is None:
                child = Node(key=key, parent=node, created=tick, chain=chain_hash(node.chain, key))
                node.children[key] = child
                page = pages[i]
                assert refcount[page] > 0, f"insert of free page {page}"
                refcount[page] += 1
                attach(child, page)
                stored.append(page)
                child.last_access = tick
                if future is not None:
                    child.next_use = future(i)
                # New, and held by the request too: neither cache-only nor evictable yet.
                node = child
                continue
            if not child.on_device:
                # Adopt the request's copy instead of reloading the offloaded one.
                self.host.release(child.host_slot)
                self.pool.incref([pages[i]])
                self._attach(child, pages[i])
                self.host_pages -= 1
                stored.append(pages[i])
            elif pages[i] != child.page:  # computed at the same time as the tree's copy
                copies.append((pages[i], child))
            child.last_access = tick
            if future is not None:
                child.next_use = future(i)
            refresh(child)
            node = child
        self.work.nodes += walked
        if (stored or copies) and self.bus.active:
            by_page = self._by_page
            self.bus.emit(
                BlockStored(
                    now_ns(), self.step, tuple(stored), len(stored) * self.page_size,
                    tuple(by_page[p].chain for p in stored),
                    tuple(p for p, _ in copies), tuple(n.chain for _, n in copies),
                )
            )  # fmt: skip
        return node

    # --- eviction ----------------------------------------------------------------

    def evict(self, n: int) -> int:
        freed = 0
        heap, evictable = self._heap, self._evictable
        while freed < n and evictable:
            _, stamp, node = heapq.heappop(heap)
            self.work.heap += 1
            if node.stamp == stamp and node in evictable:  # else a stale entry
                self._evict_node(node)
                freed += 1
        return freed

    def _evict_node(self, node: Node) -> None:
        self.evictions += 1
        parent = node.parent
        page = self._detach(node)
        offload = self.host is not None and self.should_offload() and self.host.num_free > 0
        emit = self.bus.active
        if offload:
            slot, seconds = self.host.store(page)
            node.host_slot = slot
            self.host_pages += 1
            if emit:
                self.bus.emit(PageEvicted(now_ns(), self.step, page, "offloaded", self.policy.name))
                self.bus.emit(PageOffloaded(now_ns(), self.step, page, slot, seconds))
        else:
            if node.children:
                self._drop_subtree(node)
            else:  # the usual leaf: nothing below it to drop
                del parent.children[node.key]
                node.parent = None
            self.misses.evicted(node.chain, now_ns(), self.step)
            if emit:
                self.bus.emit(PageEvicted(now_ns(), self.step, page, "dropped", self.policy.name))
                self.bus.emit(BlockRemoved(now_ns(), self.step, (page,)))
        self.pool.decref_one(page)
        self._evicted.add(page)
        self.evicted_step[page] = "offloaded" if offload else "dropped"
        if not parent.device_children:
            self._refresh(parent)  # now a leaf on the device

    def _drop_subtree(self, node: Node) -> None:
        """Unlink ``node``; its descendants (all offloaded) lose their host slots."""
        del node.parent.children[node.key]
        node.parent = None  # detached: a request continuing from here restarts at the root
        stack = list(node.children.values())
        while stack:
            self.work.nodes += 1
            child = stack.pop()
            child.parent = None
            stack.extend(child.children.values())
            assert not child.on_device, "dropping a node whose child is on the device"
            self.host.release(child.host_slot)
            self.host_pages -= 1
            self.misses.evicted(child.chain, now_ns(), self.step)

    def clear(self) -> None:
        # Parents exposed by an eviction join the heap at once, so one pass takes them too.
        self.evict(self.pool.num_pages)
        if self.bus.active:
            self.bus.emit(AllBlocksCleared(now_ns(), self.step))

    # --- introspection ---------------------------------------------------------------

    def cached_only_pages(self) -> np.ndarray:
        return np.flatnonzero(np.frombuffer(self._cache_only, dtype=np.uint8))

    def device_pages_held(self) -> np.ndarray:
        return np.fromiter(self._by_page, dtype=np.int64, count=len(self._by_page))

    def device_chains(self) -> set[int]:
        """The chain hash of every device page the cache holds: what two caches share."""
        return {node.chain for node in self._by_page.values()}

    def take_evicted(self) -> np.ndarray:
        pages = np.fromiter(self._evicted, dtype=np.int64, count=len(self._evicted))
        self._evicted.clear()
        return pages

    def nodes(self) -> list[Node]:
        """Every node under the root (a whole-tree walk: for checks, never per step)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def host_slots(self) -> set[int]:
        return {n.host_slot for n in self.nodes() if not n.on_device}

    def check_integrity(self) -> None:
        nodes = self.nodes()
        refcount = self.pool.refcount
        device = [n for n in nodes if n.on_device]
        assert len({n.page for n in device}) == len(device), "a device page stored in two nodes"
        assert {n.page: n for n in device} == self._by_page, "page -> node index drifted"
        for n in [self.root, *nodes]:
            assert n.device_children == sum(c.on_device for c in n.children.values()), (
                "device child count drifted"
            )
        for n in nodes:
            assert (n.page is None) != (n.host_slot is None), (
                "node both or neither on device and host"
            )
            assert type(n.key) is int or len(n.key) == self.page_size  # int: a replay's key
            assert n.parent.children.get(n.key) is n, "broken parent link"
            if n.on_device:
                assert refcount[n.page] >= 1, f"cached page {n.page} has no reference"
                assert n.parent is self.root or n.parent.on_device, "device page under a host page"
        only = sorted(n.page for n in device if refcount[n.page] == 1)
        assert self.cached_only_pages().tolist() == only, "cache-only set drifted"
        assert self._num_cached_only == len(only), "cache-only count drifted"
        evictable = {n for n in device if refcount[n.page] == 1 and not n.device_children}
        assert self._evictable == evictable, "evictable set drifted"
        live = [(prio, n) for prio, stamp, n in self._heap if n in evictable and n.stamp == stamp]
        assert len(live) == len(evictable) and {n for _, n in live} == evictable, (
            "the heap's live entries are not the evictable leaves"
        )
        assert all(prio == n.queued == self._policy.priority(n) for prio, n in live), (
            "a heap entry's priority is stale"
        )
        assert len(nodes) - len(device) == self.host_pages, "host page count drifted"


__all__ = ["CacheWork", "Node", "RadixCache"]
