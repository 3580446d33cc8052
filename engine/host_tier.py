"""The CPU offload tier: a host-memory page pool that evicted or swapped pages move to.

Same page layout as the device pool, so a page moves with one copy per
direction (pinned memory when CUDA is present, for asynchronous DMA).
"""

from __future__ import annotations

import time

import torch


class HostTier:
    def __init__(self, device_pages: torch.Tensor, num_slots: int) -> None:
        shape = (device_pages.shape[0], num_slots, *device_pages.shape[2:])
        pin = torch.cuda.is_available() and device_pages.is_cuda
        self.device_pages = device_pages
        self.pages = torch.empty(shape, dtype=device_pages.dtype, pin_memory=pin)
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def store(self, page: int) -> tuple[int, float]:
        """Copy a device page out; returns (host slot, seconds)."""
        slot = self._free.pop()
        t0 = time.perf_counter()
        self.pages[:, slot].copy_(self.device_pages[:, page])
        return slot, time.perf_counter() - t0

    def load(self, slot: int, page: int) -> float:
        """Copy a host slot back into a device page; frees the slot. Returns seconds."""
        t0 = time.perf_counter()
        self.device_pages[:, page].copy_(self.pages[:, slot])
        seconds = time.perf_counter() - t0
        self.release(slot)
        return seconds

    def release(self, slot: int) -> None:
        assert slot not in self._free, f"host slot {slot} freed twice"
        self._free.append(slot)

    def check_integrity(self, held: set[int]) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "host slot twice in the free list"
        assert not (free & held), "host slot both free and held"
        assert len(free) + len(held) == self.num_slots, "host slots leaked"
