"""The CPU offload tier: a host-memory page pool that evicted or swapped pages move to.

Slot-major: each host tensor is ``[num_slots, layers, ...]``, so one slot (a
page of every layer) is one contiguous block, and a run of consecutive slots
is one too. A batch of pages moves with one copy per tensor and direction:
the device pages are gathered into a contiguous device staging tensor (the
device pool is ``[layers, pages, ...]``, where a page is strided), which is
copied to a run of slots; loads go the other way. On CUDA the tier is pinned
memory and every copy runs on a side stream: the host thread never waits for
it, the copy overlaps the compute already queued, and the compute stream waits
(on the GPU, through an event) only where it must: a page written back from
the host before the step that reads it, and a page copied out before anything
queued later can overwrite it. A host read of a slot (InfLLM's exact scoring)
first waits on the event of the copy that wrote it (``wait_host``).
"""

from __future__ import annotations

import time

import torch


def runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """``(first index in slots, first slot, length)`` of each run of consecutive slots."""
    out: list[tuple[int, int, int]] = []
    for i, slot in enumerate(slots):
        if out and out[-1][1] + out[-1][2] == slot:
            first, start, n = out[-1]
            out[-1] = (first, start, n + 1)
        else:
            out.append((i, slot, 1))
    return out


def _index(pages: list[int], device: torch.device) -> torch.Tensor:
    """Page ids on ``device``; an asynchronous copy from pageable memory does not wait for
    the queued work (a blocking one would sync the side stream, which waits on compute)."""
    return torch.tensor(pages).to(device, non_blocking=True)


class HostTier:
    def __init__(self, device_tensors: list[torch.Tensor], num_slots: int) -> None:
        """``device_tensors``: the stacked ``[layers, num_pages, ...]`` tensors of the device pool."""
        self.device_tensors = device_tensors
        cuda = device_tensors[0].is_cuda
        self.tensors = [
            torch.empty((num_slots, t.shape[0], *t.shape[2:]), dtype=t.dtype, pin_memory=cuda)
            for t in device_tensors
        ]
        self.stream = torch.cuda.Stream(device_tensors[0].device) if cuda else None
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._written: dict[int, torch.cuda.Event] = {}  # slot -> the copy that fills it
        self.copies = 0  # host<->device copies issued (one per run of slots and tensor)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def _allocate(self, n: int) -> list[int]:
        """``n`` free slots, consecutive where the free list allows (the lowest run first)."""
        assert n <= len(self._free), f"{n} host slots wanted, {len(self._free)} free"
        if n == 1:  # one page (a radix-cache offload): the lowest free slot, without a sort
            slot = min(self._free)
            self._free.remove(slot)
            return [slot]
        free = sorted(self._free)
        for i in range(len(free) - n + 1):
            if free[i + n - 1] - free[i] == n - 1:
                chosen = free[i : i + n]
                break
        else:
            chosen = free[:n]
        taken = set(chosen)
        self._free = [s for s in self._free if s not in taken]
        return chosen

    def _on_side_stream(self, work) -> torch.cuda.Event | None:
        """Run ``work()`` ordered after the queued compute and before the compute queued
        next, without the host waiting; returns the event marking its end (None on the CPU)."""
        if self.stream is None:
            work()
            return None
        compute = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            work()
        done = torch.cuda.Event()
        done.record(self.stream)
        compute.wait_event(done)
        return done

    def store_many(self, pages: list[int]) -> tuple[list[int], float]:
        """Copy device pages out; returns (their host slots, the host's seconds)."""
        t0 = time.perf_counter()
        slots = self._allocate(len(pages))
        device = self.device_tensors[0].device
        non_blocking = self.stream is not None

        def work() -> None:
            for first, start, n in runs(slots):
                idx = _index(pages[first : first + n], device)
                for h, d in zip(self.tensors, self.device_tensors, strict=True):
                    staged = d.index_select(1, idx).transpose(0, 1).contiguous()  # [n, L, ...]
                    h[start : start + n].copy_(staged, non_blocking=non_blocking)
                    self.copies += 1

        done = self._on_side_stream(work)
        if done is not None:
            for slot in slots:
                self._written[slot] = done
        return slots, time.perf_counter() - t0

    def store(self, page: int) -> tuple[int, float]:
        """Copy one device page out; returns (host slot, seconds)."""
        slots, seconds = self.store_many([page])
        return slots[0], seconds

    def read(self, slots: list[int], pages: list[int], layer: int | None = None) -> float:
        """Copy host slots into device pages (of every layer, or of ``layer`` only); the
        slots stay held. Returns the host's seconds."""
        t0 = time.perf_counter()
        device = self.device_tensors[0].device
        non_blocking = self.stream is not None

        # One layer of a run of slots is strided in the slot-major layout: copy slot by slot.
        spans = runs(slots) if layer is None else [(i, s, 1) for i, s in enumerate(slots)]

        def work() -> None:
            for first, start, n in spans:
                idx = _index(pages[first : first + n], device)
                for h, d in zip(self.tensors, self.device_tensors, strict=True):
                    src = h[start : start + n] if layer is None else h[start : start + n, layer]
                    staged = src.to(device, non_blocking=non_blocking)
                    if layer is None:
                        d.index_copy_(1, idx, staged.transpose(0, 1))
                    else:
                        d[layer].index_copy_(0, idx, staged)
                    self.copies += 1

        self._on_side_stream(work)
        return time.perf_counter() - t0

    def load_many(self, slots: list[int], pages: list[int]) -> float:
        """Copy host slots back into device pages and free the slots. Returns seconds."""
        seconds = self.read(slots, pages)
        for slot in slots:
            self.release(slot)
        return seconds

    def load(self, slot: int, page: int) -> float:
        """Copy one host slot back into a device page; frees the slot. Returns seconds."""
        return self.load_many([slot], [page])

    def wait_host(self, slots: list[int]) -> None:
        """Block until the copies that fill ``slots`` have landed, before the host reads them."""
        for slot in slots:
            event = self._written.get(slot)
            if event is not None:
                event.synchronize()
                del self._written[slot]

    def release(self, slot: int) -> None:
        assert slot not in self._free, f"host slot {slot} freed twice"
        self._free.append(slot)

    def check_integrity(self, held: set[int]) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "host slot twice in the free list"
        assert not (free & held), "host slot both free and held"
        assert len(free) + len(held) == self.num_slots, "host slots leaked"
