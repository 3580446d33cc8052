"""KV-cache bookkeeping: pages per request, the prefix cache, the host tier, and their events.

The scheduler asks this manager for pages; the manager owns the ``PagePool``,
the ``RadixCache`` (optional) and the ``HostTier`` (optional), and emits every
change (pages allocated/freed, prefix lookups, swaps) so the profiler can
replay page occupancy exactly. Token data itself lives in ``KVStorage``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kvscope.engine.events import (
    PAGE_CACHED,
    PAGE_EVICTED,
    PAGE_FREE,
    EventBus,
    PageMap,
    PagesAllocated,
    PagesFreed,
    PrefixLookup,
    PrefixMiss,
    encode_holds,
    now_ns,
)
from kvscope.engine.host_tier import HostTier
from kvscope.engine.miss_reasons import MissSplit
from kvscope.engine.page_pool import PagePool
from kvscope.engine.prefix_cache import PrefixCache
from kvscope.engine.request import Request

OFFLOADED = -1  # a request's logical page whose data lives in the host tier (InfLLM)


class OffloadingMemory(Protocol):
    """What the manager needs from a memory that moves some of a request's pages off the
    device and keeps device pages of its own (InfLLM's retrieved blocks): the narrow
    interface, as the eviction policies have, so the manager knows none of its internals."""

    def drop(self, req: Request) -> list[int]: ...

    def cache_pages(self, req: Request) -> list[int]: ...

    def host_slots(self) -> set[int]: ...


class KVCacheManager:
    def __init__(self, pool: PagePool, bus: EventBus, *, prefix: PrefixCache | None = None,
                 host: HostTier | None = None) -> None:  # fmt: skip
        """Built by ``engine.kv_stack.build_kv_stack``, which makes the pool, the host tier
        and the prefix cache for it."""
        self.pool = pool
        self.page_size = pool.page_size
        self.bus = bus
        self.step = 0
        self.holders: dict[int, Request] = {}
        self.prefix = prefix
        self.host = host
        self.swapped: dict[int, Request] = {}
        self.infllm: OffloadingMemory | None = None  # set by the engine in infllm attention mode
        # Prefix-cache accounting in tokens, counted once per request, at its first admission
        # (hit rate = hit / queried); a recompute-preempted request's re-lookups are kept
        # apart, as vLLM's preempted_queries/preempted_hits: its own pages hit again.
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_misses = MissSplit()  # the missed tokens by reason, summed likewise
        self.preempted_queried_tokens = 0
        self.preempted_hit_tokens = 0

    def set_step(self, step: int) -> None:
        self.step = step
        if self.prefix is not None:
            self.prefix.step = step
            evicted = getattr(self.prefix, "evicted_step", None)
            if evicted is not None:
                evicted.clear()

    # --- growth and release -----------------------------------------------------

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def missing_pages(self, req: Request, num_tokens: int) -> int:
        return max(0, self.pages_for(num_tokens) - len(req.pages))

    def can_grow(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        return self.missing_pages(req, num_tokens) + reserve <= self.pool.num_free

    def reclaim(self, n: int) -> int:
        """Evict up to ``n`` cache-only pages (by the eviction policy); returns pages freed."""
        return self.prefix.evict(n) if self.prefix is not None else 0

    def grow(self, req: Request, num_tokens: int) -> None:
        """Give ``req`` enough pages to hold ``num_tokens`` tokens."""
        n = self.missing_pages(req, num_tokens)
        if n == 0:
            return
        pages = self.pool.allocate(n)
        req.pages.extend(pages)
        self.holders[req.request_id] = req
        if self.bus.active:
            self.bus.emit(PagesAllocated(now_ns(), self.step, req.request_id, tuple(pages)))

    def release(self, req: Request) -> None:
        """Drop the request's references to its pages (cached copies stay in the prefix cache)."""
        req.cache_node, req.cached_pages = None, 0
        if not req.pages:
            return
        pages = self.device_pages(req)
        if self.infllm is not None:
            self.infllm.drop(req)
        req.pages = []
        if self.prefix is not None:
            self.prefix.release(pages)  # the cache's unlock: its evictable set stays exact
        else:
            self.pool.decref(pages)
        self.holders.pop(req.request_id, None)
        if self.bus.active:
            self.bus.emit(PagesFreed(now_ns(), self.step, req.request_id, tuple(pages)))

    def device_pages(self, req: Request) -> list[int]:
        """Device pages the request holds: its own (infllm's offloaded ones excluded) and its
        retrieved-block cache."""
        if self.infllm is None:
            return req.pages
        return [p for p in req.pages if p != OFFLOADED] + self.infllm.cache_pages(req)

    # --- prefix cache -------------------------------------------------------------

    def match_prefix(self, req: Request) -> int:
        """Give a request with no pages its longest cached prefix; returns the tokens hit.

        The lookup is accounted only by ``admitted`` (a request that matches but
        then does not fit gives its pages back with ``retreat`` and looks up
        again later; counting both would skew the hit rate).
        """
        if self.prefix is None:
            return 0
        pages, hit = self.prefix.match(req.token_ids())
        if pages:
            req.pages = pages
            req.num_computed = hit
            req.cached_pages = len(pages)
            self.holders[req.request_id] = req
            if self.bus.active:
                self.bus.emit(PagesAllocated(now_ns(), self.step, req.request_id, tuple(pages)))
        return hit

    def admitted(self, req: Request, hit: int) -> None:
        """Account the prefix lookup of a request that was just admitted."""
        if self.prefix is None:
            return
        queried = req.num_tokens
        if req.num_preemptions:
            self.preempted_queried_tokens += queried
            self.preempted_hit_tokens += hit
            if self.bus.active:
                lookup = PrefixLookup(now_ns(), self.step, req.request_id, queried, hit, True)
                self.bus.emit(lookup)
            return
        self.prefix_queried_tokens += queried
        self.prefix_hit_tokens += hit
        if req.scheduled_ns is None:
            req.num_cached = hit
        misses = self.prefix.explain_misses(req.token_ids(), req.pages[: hit // self.page_size])
        self.prefix_misses.add(misses)
        if self.bus.active:
            ts, rid = now_ns(), req.request_id
            self.bus.emit(PrefixLookup(ts, self.step, rid, queried, hit))
            self.bus.emit(
                PrefixMiss(
                    ts,
                    self.step,
                    rid,
                    misses.cold,
                    misses.capacity,
                    misses.granularity,
                    misses.last_token,
                    misses.capacity_pages,
                    misses.capacity_age_s,
                    misses.capacity_age_steps,
                )
            )

    def retreat(self, req: Request) -> None:
        """A waiting request that could not be admitted holds no pages while it waits.

        Otherwise waiting requests pin cached pages that nobody can evict, and
        with nothing running the engine would wait forever. The pages stay in
        the prefix cache (now evictable); the request will match them again.
        """
        self.release(req)
        req.num_computed = 0

    def offer(self, req: Request) -> None:
        """Insert the request's newly completed full pages into the prefix cache."""
        if self.prefix is None:
            return
        full = req.num_computed // self.page_size
        if full > req.cached_pages:
            tokens = req.token_ids()[: full * self.page_size]
            req.cache_node = self.prefix.insert(tokens, req.pages, req.cache_node, req.cached_pages)
            req.cached_pages = full

    # --- swap preemption -------------------------------------------------------------

    def can_swap_out(self, req: Request) -> bool:
        return self.host is not None and self.host.num_free >= len(req.pages)

    def swap_out(self, req: Request) -> None:
        """Copy the request's pages to the host tier and release them on the device."""
        req.host_slots = self.host.store_many(req.pages)[0]  # one copy per run of slots
        self.swapped[req.request_id] = req
        self.release(req)

    def swap_in(self, req: Request) -> None:
        """Bring a swapped-out request's pages back (the caller checked there is room)."""
        pages = self.pool.allocate(len(req.host_slots))
        self.host.load_many(req.host_slots, pages)
        req.host_slots = []
        self.swapped.pop(req.request_id, None)
        req.pages = pages
        self.holders[req.request_id] = req
        if self.bus.active:
            self.bus.emit(PagesAllocated(now_ns(), self.step, req.request_id, tuple(pages)))

    # --- introspection -----------------------------------------------------------------

    def occupancy(self) -> tuple[int, int]:
        """(tokens stored in device pages, pages only the prefix cache holds), for step summaries.

        O(running requests), nothing per page or per tree node: only full pages
        are ever shared or cached, so every used page is full except the
        unwritten tail of each request's own pages, and the cache keeps its
        cache-only count as it goes (``check_integrity`` checks both against a
        page-by-page count).
        """
        ps = self.page_size
        empty_slots = sum(len(req.pages) * ps - req.num_computed for req in self.holders.values())
        cached = self.prefix.num_cached_only if self.prefix is not None else 0
        return self.pool.num_used * ps - empty_slots, cached

    @property
    def host_pages_used(self) -> int:
        return self.host.num_used if self.host is not None else 0

    def page_owners(self) -> np.ndarray:
        """Owner of every page: a request id, PAGE_CACHED, PAGE_EVICTED (since the last map) or PAGE_FREE.

        Array writes per owner, no Python loop over pages. Later writes win, so
        an evicted page that is held again shows its holder, and PAGE_EVICTED
        stays only on pages that are still free.
        """
        owners = np.full(self.pool.num_pages, PAGE_FREE, dtype=np.int32)
        if self.prefix is not None:
            owners[self.prefix.take_evicted()] = PAGE_EVICTED
            owners[self.prefix.cached_only_pages()] = PAGE_CACHED
        for rid, req in self.holders.items():
            owners[self.device_pages(req)] = rid
        return owners

    def page_holds(self) -> dict[int, list[int]]:
        """Every holding request's device pages (shared ones in each holder's list)."""
        return {rid: self.device_pages(req) for rid, req in self.holders.items()}

    def tree_pages(self) -> np.ndarray:
        """Device pages in the prefix tree (held by requests or not)."""
        if self.prefix is None:
            return np.zeros(0, np.int64)
        return self.prefix.device_pages_held()

    def emit_page_map(self) -> None:
        if self.bus.active:
            self.bus.emit(
                PageMap(
                    now_ns(),
                    self.step,
                    self.page_owners(),
                    holds=encode_holds(self.page_holds()),
                    tree=self.tree_pages().astype(np.int32),
                )
            )

    def check_integrity(self) -> None:
        """Pool, cache and host tier agree; every reference is accounted for; the step
        summary's O(requests) occupancy equals a page-by-page count."""
        self.pool.check_integrity()
        n, ps = self.pool.num_pages, self.page_size
        held = [np.asarray(self.device_pages(req), dtype=np.int64) for req in self.holders.values()]
        by_requests = np.bincount(np.concatenate([np.zeros(0, np.int64), *held]), minlength=n)
        by_cache = np.zeros(n, dtype=np.int64)
        fill = np.zeros(n, dtype=np.int64)  # tokens stored per page (a shared page counts once)
        for req in self.holders.values():
            pages = np.asarray(req.pages, dtype=np.int64)
            written = np.clip(req.num_computed - ps * np.arange(len(pages)), 0, ps)
            on_device = pages != OFFLOADED
            np.maximum.at(fill, pages[on_device], written[on_device])
            if self.infllm is not None:
                fill[self.infllm.cache_pages(req)] = ps  # retrieved blocks: full pages
        if self.prefix is not None:
            self.prefix.check_integrity()
            cached = self.prefix.device_pages_held()
            by_cache[cached] = 1
            fill[cached] = ps
            only = np.flatnonzero((by_cache == 1) & (by_requests == 0))
            assert np.array_equal(np.sort(self.prefix.cached_only_pages()), only), (
                "cache-only pages differ from the page-by-page count"
            )
        wrong = np.flatnonzero(np.asarray(self.pool.refcount) != by_requests + by_cache)
        assert not len(wrong), (
            f"page {wrong[0]}: refcount {self.pool.refcount[wrong[0]]}, "
            f"holders {by_requests[wrong[0]] + by_cache[wrong[0]]}"
        )
        assert self.occupancy() == (
            int(fill.sum()),
            int((by_requests == 0).sum() - self.pool.num_free),
        ), "step-summary occupancy differs from the page-by-page count"
        if self.host is not None:
            held = self.prefix.host_slots() if self.prefix is not None else set()
            if self.infllm is not None:
                held |= self.infllm.host_slots()
            for req in self.swapped.values():
                assert not (held & set(req.host_slots)), "host slot held twice"
                held |= set(req.host_slots)
            self.host.check_integrity(held)
