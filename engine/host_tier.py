"""The CPU offload tier: a host-memory page pool that evicted or swapped pages move to.

Same page layout as the device pool (payload and, for int8/int4, scales), so
a page moves with one copy per tensor and direction (pinned memory when CUDA
is present, for asynchronous DMA).
"""

from __future__ import annotations

import time

import torch


class HostTier:
    def __init__(self, device_tensors: list[torch.Tensor], num_slots: int) -> None:
        """``device_tensors``: the stacked ``[layers, num_pages, ...]`` tensors of the device pool."""
        self.device_tensors = device_tensors
        self.tensors = [
            torch.empty((t.shape[0], num_slots, *t.shape[2:]), dtype=t.dtype, pin_memory=t.is_cuda)
            for t in device_tensors
        ]
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
        for host, device in zip(self.tensors, self.device_tensors, strict=True):
            host[:, slot].copy_(device[:, page])
        return slot, time.perf_counter() - t0

    def load(self, slot: int, page: int) -> float:
        """Copy a host slot back into a device page; frees the slot. Returns seconds."""
        t0 = time.perf_counter()
        for host, device in zip(self.tensors, self.device_tensors, strict=True):
            device[:, page].copy_(host[:, slot])
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
