"""The CPU offload tier: a host-memory page pool that evicted or swapped pages move to.

Same page layout as the device pool (payload and, for int8/int4, scales), so
a page moves with one copy per tensor and direction. On CUDA the tier is
pinned memory and the copies run on a side stream: the host thread never
waits for them, the copy overlaps the compute already queued, and the
compute stream waits (on the GPU, through an event) only where it must: a
page written back from the host before the step that reads it, and a page
copied out before anything queued later can overwrite it.
"""

from __future__ import annotations

import time

import torch


class HostTier:
    def __init__(self, device_tensors: list[torch.Tensor], num_slots: int) -> None:
        """``device_tensors``: the stacked ``[layers, num_pages, ...]`` tensors of the device pool."""
        self.device_tensors = device_tensors
        cuda = device_tensors[0].is_cuda
        self.tensors = [
            torch.empty((t.shape[0], num_slots, *t.shape[2:]), dtype=t.dtype, pin_memory=cuda)
            for t in device_tensors
        ]
        self.stream = torch.cuda.Stream(device_tensors[0].device) if cuda else None
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """dst.copy_(src) for each pair; on CUDA ordered after the queued compute and before
        the compute queued next, without the host waiting. Returns the host's seconds."""
        t0 = time.perf_counter()
        if self.stream is None:
            for dst, src in pairs:
                dst.copy_(src)
            return time.perf_counter() - t0
        compute = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self.stream)
        compute.wait_event(done)
        return time.perf_counter() - t0

    def store(self, page: int) -> tuple[int, float]:
        """Copy a device page out; returns (host slot, seconds)."""
        slot = self._free.pop()
        pairs = [
            (h[:, slot], d[:, page]) for h, d in zip(self.tensors, self.device_tensors, strict=True)
        ]
        return slot, self._copy(pairs)

    def load(self, slot: int, page: int) -> float:
        """Copy a host slot back into a device page; frees the slot. Returns seconds."""
        pairs = [
            (d[:, page], h[:, slot]) for h, d in zip(self.tensors, self.device_tensors, strict=True)
        ]
        seconds = self._copy(pairs)
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
