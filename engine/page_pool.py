"""The device page pool: which pages are free, and how many holders each page has.

A page is free exactly when its reference count is zero. Running requests hold
one reference on each of their pages; the prefix cache holds one on each page
it stores, so a page shared by the cache and two requests has count 3.
Allocation is LIFO from a free list so recently freed (cache-warm) pages are
reused first.
"""

from __future__ import annotations

import numpy as np


class OutOfPages(Exception):
    """Raised when an allocation asks for more pages than are free."""


class PagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        assert num_pages > 0 and page_size > 0
        self.num_pages = num_pages
        self.page_size = page_size
        self.refcount = [0] * num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free pages, each with one reference."""
        if n > len(self._free):
            raise OutOfPages(f"need {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self.refcount[p] = 1
        return pages

    def incref(self, pages: list[int]) -> None:
        for p in pages:
            assert self.refcount[p] > 0, f"incref on free page {p}"
            self.refcount[p] += 1

    def decref(self, pages: list[int]) -> list[int]:
        """Drop one reference from each page; returns the pages that became free."""
        freed = []
        for p in pages:
            assert self.refcount[p] > 0, f"decref on free page {p}"
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self._free.append(p)
                freed.append(p)
        return freed

    def decref_one(self, page: int) -> bool:
        """``decref([page])`` without the lists (the prefix cache's eviction path); True if
        the page became free."""
        refcount = self.refcount
        assert refcount[page] > 0, f"decref on free page {page}"
        refcount[page] -= 1
        if refcount[page]:
            return False
        self._free.append(page)
        return True

    def check_integrity(self) -> None:
        """Every page is either free (count 0, once in the free list) or held (count > 0)."""
        counts = np.asarray(self.refcount)
        in_free = np.bincount(np.asarray(self._free, dtype=np.int64), minlength=self.num_pages)
        assert in_free.max(initial=0) <= 1, "page twice in the free list"
        assert (counts >= 0).all(), f"negative refcount on page {int(np.argmin(counts))}"
        wrong = np.flatnonzero((counts == 0) != (in_free == 1))
        assert not len(wrong), (
            f"page {wrong[0]}: refcount {counts[wrong[0]]}, free={bool(in_free[wrong[0]])}"
        )
