"""Radix prefix cache: random match / insert / extend / release / evict / offload / reload
sequences under every eviction policy.

After every operation: the cache's own invariants hold (among them: the heap's
live entries are exactly the evictable leaves, keyed by the current policy),
every page's reference count equals its holders (requests + cache nodes), no
page is both free and held, host slots are neither leaked nor double-held.
Every single eviction takes a leaf of minimal priority, checked against a
brute-force walk of the tree.
"""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvscope.engine.events import EventBus
from kvscope.engine.eviction import FIFO, LFU, LRU
from kvscope.engine.host_tier import HostTier
from kvscope.engine.page_pool import PagePool
from kvscope.engine.radix_cache import RadixCache

PAGE = 2
PAGES = 12

# Token streams drawn from a tiny alphabet over a few shared stems make prefix hits common.
stems = st.sampled_from([[1, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9, 1]])
tails = st.lists(st.integers(1, 3), max_size=6)


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = PagePool(PAGES, PAGE)
        storage = torch.zeros(1, PAGES, 2, PAGE, 1, 1)
        self.host = HostTier([storage], 6)
        self.offload = False
        self.events = []
        bus = EventBus()
        bus.subscribe(self.events.append)
        self.cache = RadixCache(
            self.pool, bus, LRU(), self.host, should_offload=lambda: self.offload
        )
        self.holders: list[tuple[list[int], list[int], object]] = []  # (tokens, pages, handle)

    @rule(stem=stems, tail=tails)
    def request(self, stem, tail):
        tokens = stem + tail
        pages, hit = self.cache.match(tokens)
        assert hit == len(pages) * PAGE and hit <= len(tokens) - 1
        assert tokens[:hit] == tokens[:hit]
        need = -(-len(tokens) // PAGE) - len(pages)
        if need > self.pool.num_free:
            self.cache.evict(need - self.pool.num_free)
        if need > self.pool.num_free:
            self.cache.release(pages)  # refused for lack of pages: give the hit back
            return
        pages = pages + self.pool.allocate(need)
        handle = self.cache.insert(tokens, pages)
        self.holders.append((tokens, pages, handle))

    @rule(i=st.integers(0, 20), more=st.lists(st.integers(1, 3), min_size=1, max_size=5))
    def extend(self, i, more):
        """A running request grows and offers its new full pages, continuing from its handle
        (which may have been offloaded or dropped meanwhile)."""
        if not self.holders:
            return
        tokens, pages, handle = self.holders.pop(i % len(self.holders))
        tokens = tokens + more
        need = -(-len(tokens) // PAGE) - len(pages)
        if need > self.pool.num_free:
            self.cache.evict(need - self.pool.num_free)
        if need > self.pool.num_free:
            self.cache.release(pages)
            return
        offered = (len(tokens) - len(more)) // PAGE
        pages = pages + self.pool.allocate(need)
        handle = self.cache.insert(tokens, pages, handle, offered)
        self.holders.append((tokens, pages, handle))

    @rule(i=st.integers(0, 20))
    def finish(self, i):
        if self.holders:
            _, pages, _ = self.holders.pop(i % len(self.holders))
            self.cache.release(pages)

    @rule(n=st.integers(1, 6))
    def evict(self, n):
        before = self.pool.num_free
        freed = self.cache.evict(n)
        assert self.pool.num_free == before + freed

    @rule()
    def evict_one_in_policy_order(self):
        nodes = self.cache.nodes()
        leaves = [
            n
            for n in nodes
            if n.on_device
            and self.pool.refcount[n.page] == 1
            and not any(c.on_device for c in n.children.values())
        ]
        assert self.cache.evict(1) == (1 if leaves else 0)
        if leaves:
            lowest = min(self.cache.policy.priority(n) for n in leaves)
            gone = [n for n in leaves if not n.on_device]
            assert len(gone) == 1 and self.cache.policy.priority(gone[0]) == lowest

    @rule(on=st.booleans())
    def toggle_offload(self, on):
        self.offload = on

    @rule(policy=st.sampled_from([LRU, LFU, FIFO]))
    def set_policy(self, policy):
        self.cache.policy = policy()

    @invariant()
    def consistent(self):
        self.pool.check_integrity()
        self.cache.check_integrity()
        counts = [0] * PAGES
        for _, pages, _ in self.holders:
            for p in pages:
                counts[p] += 1
        for p in self.cache.device_pages_held():
            counts[p] += 1
        assert counts == self.pool.refcount
        assert self.cache.num_cached_only == sum(
            1 for p in self.cache.device_pages_held() if self.pool.refcount[p] == 1
        )
        self.host.check_integrity(self.cache.host_slots())


CacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestRadixCache = CacheMachine.TestCase


def test_hit_after_insert_and_offload_roundtrip():
    pool = PagePool(4, 2)
    storage = torch.randn(1, 4, 2, 2, 1, 1)
    host = HostTier([storage], 4)
    cache = RadixCache(pool, EventBus(), LRU(), host, should_offload=lambda: True)
    tokens = [5, 6, 7, 8, 9]
    pages = pool.allocate(3)
    cache.insert(tokens, pages)
    assert cache.device_pages == 2  # two full pages; the partial third is never shared
    original = storage[:, pages[:2]].clone()
    cache.release(pages)
    assert cache.evict(2) == 2 and cache.host_pages == 2
    storage[:, pages[:2]] = 0  # the device copies are gone
    got, hit = cache.match(tokens)
    assert hit == 4
    assert torch.equal(storage[:, got], original)  # reloaded intact


def test_continuing_from_an_offloaded_node_adopts_the_request_copy():
    """A request that computed its own copy of a cached page continues its inserts from
    that node; if the node was offloaded meanwhile, new pages must not hang under a host
    page: the insert restarts at the root and adopts the request's copy."""
    pool = PagePool(8, 2)
    host = HostTier([torch.zeros(1, 8, 2, 2, 1, 1)], 4)
    cache = RadixCache(pool, EventBus(), LRU(), host, should_offload=lambda: True)
    first = pool.allocate(3)
    cache.insert([1, 2, 3, 4, 5], first)
    second = pool.allocate(3)  # computed the same prefix concurrently: its copies are not stored
    handle = cache.insert([1, 2, 3, 4, 6], second)
    assert handle.page == first[1]
    cache.release(first)
    assert cache.evict(1) == 1 and not handle.on_device  # the only leaf: offloaded
    tokens = [1, 2, 3, 4, 6, 7, 8, 9]
    pages = second + pool.allocate(1)
    deepest = cache.insert(tokens, pages, handle, 2)
    cache.check_integrity()
    assert handle.page == second[1] and cache.host_pages == 0  # adopted, host slot freed
    assert deepest.page == pages[3] and deepest.parent.parent is handle
