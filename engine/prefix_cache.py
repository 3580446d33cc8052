"""The prefix cache's contract: what the KV manager may ask of any prefix cache.

Pages are shared by reference count (engine/page_pool.py). ``match`` locks
the pages it returns by taking one reference each for the caller, and
``release`` is the matching unlock: a caller drops its references to pages
that may be cached through the cache, never behind its back, so the cache
can keep its evictable set exact without walking anything (mini-sglang's
kvcache/base.py and SGLang's lock_ref, with the pool's count as the lock).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


class PrefixCache(ABC):
    """A cache of full KV pages keyed by the token prefix they complete."""

    step: int  # the engine step stamped on the cache's events

    @abstractmethod
    def match(self, tokens: list[int]) -> tuple[list[int], int]:
        """Longest cached prefix of ``tokens`` that leaves at least one token to compute.

        Returns its device pages, one reference each taken for (locked by) the
        caller, and the number of tokens they hold.
        """

    @abstractmethod
    def release(self, pages: list[int]) -> None:
        """Drop one reference from each page (the unlock); cached pages may become evictable."""

    @abstractmethod
    def insert(
        self, tokens: list[int], pages: list[int], handle: Any = None, start_page: int = 0
    ) -> Any:
        """Store the full pages of ``tokens`` (held in ``pages``); returns a handle to the
        deepest entry, from which a later insert of the same request continues at
        ``start_page`` instead of starting over."""

    @abstractmethod
    def evict(self, n: int) -> int:
        """Free up to ``n`` device pages only the cache holds; returns how many were freed."""

    @abstractmethod
    def clear(self) -> None:
        """Evict every page no request holds."""

    @property
    @abstractmethod
    def num_cached_only(self) -> int:
        """Device pages held by the cache and nobody else."""

    @abstractmethod
    def cached_only_pages(self) -> np.ndarray:
        """The ``num_cached_only`` pages, as an int64 array."""

    @abstractmethod
    def device_pages_held(self) -> np.ndarray:
        """Every device page the cache holds a reference on, as an int64 array."""

    @abstractmethod
    def host_slots(self) -> set[int]:
        """Host-tier slots holding offloaded cached pages."""

    @abstractmethod
    def take_evicted(self) -> np.ndarray:
        """Pages evicted since the previous call (int64), for the next page map."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Assert every invariant of the cache's own bookkeeping."""
