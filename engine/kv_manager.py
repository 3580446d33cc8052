"""KV-cache bookkeeping: which request holds which pages, and every change as an event.

The scheduler asks this manager for pages; the manager owns the ``PagePool``
and emits ``PagesAllocated``/``PagesFreed`` so the profiler can replay page
occupancy exactly. Token data itself lives in ``KVStorage`` (engine/kv_storage.py).
"""

from __future__ import annotations

import numpy as np

from engine.events import PAGE_FREE, EventBus, PageMap, PagesAllocated, PagesFreed, now_ns
from engine.page_pool import PagePool
from engine.request import Request


class KVCacheManager:
    def __init__(self, num_pages: int, page_size: int, bus: EventBus) -> None:
        self.pool = PagePool(num_pages, page_size)
        self.page_size = page_size
        self.bus = bus
        self.step = 0
        self.holders: dict[int, Request] = {}

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def missing_pages(self, req: Request, num_tokens: int) -> int:
        return max(0, self.pages_for(num_tokens) - len(req.pages))

    def can_grow(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        return self.missing_pages(req, num_tokens) + reserve <= self.pool.num_free

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
        """Drop the request's references to its pages."""
        if not req.pages:
            return
        pages = req.pages
        req.pages = []
        self.pool.decref(pages)
        self.holders.pop(req.request_id, None)
        if self.bus.active:
            self.bus.emit(PagesFreed(now_ns(), self.step, req.request_id, tuple(pages)))

    @property
    def tokens_held(self) -> int:
        return sum(r.num_computed for r in self.holders.values())

    def page_owners(self) -> np.ndarray:
        """Owner of every page: a request id, or PAGE_FREE."""
        owners = np.full(self.pool.num_pages, PAGE_FREE, dtype=np.int32)
        for rid, req in self.holders.items():
            owners[req.pages] = rid
        return owners

    def emit_page_map(self) -> None:
        if self.bus.active:
            self.bus.emit(PageMap(now_ns(), self.step, self.page_owners()))

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        counts = [0] * self.pool.num_pages
        for req in self.holders.values():
            for p in req.pages:
                counts[p] += 1
        for p, c in enumerate(counts):
            assert self.pool.refcount[p] >= c, f"page {p} held {c} times but refcount {self.pool.refcount[p]}"
