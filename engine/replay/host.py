"""The host tier without tensors: slots and modelled copy times, for replays.

A replay has no KV data to copy, so this keeps only what the radix cache and
the KV manager ask of ``engine.host_tier.HostTier`` (the same methods): which
slots are free, and how long a page's copy over the device's host link takes
(bytes over PCIe bandwidth), which the roofline timing adds to the step.
"""

from __future__ import annotations

from kvscope.engine.host_tier import HostTier


class SlotTier(HostTier):
    """``HostTier``'s slot bookkeeping (free list, release, integrity) without its tensors."""

    def __init__(self, num_slots: int, page_copy_s: float = 0.0) -> None:  # no super(): no tensors
        self.num_slots = num_slots
        self.page_copy_s = page_copy_s
        self._free = list(range(num_slots - 1, -1, -1))
        self.copy_s = 0.0  # modelled copy seconds since the driver last took them
        self.stores = self.loads = 0

    def store(self, page: int) -> tuple[int, float]:
        self.stores += 1
        self.copy_s += self.page_copy_s
        return self._free.pop(), self.page_copy_s

    def load(self, slot: int, page: int) -> float:
        self.loads += 1
        self.copy_s += self.page_copy_s
        self.release(slot)
        return self.page_copy_s

    def store_many(self, pages: list[int]) -> tuple[list[int], float]:
        slots = [self.store(page)[0] for page in pages]
        return slots, self.page_copy_s * len(pages)

    def load_many(self, slots: list[int], pages: list[int]) -> float:
        return sum(self.load(slot, page) for slot, page in zip(slots, pages, strict=True))

    def release(self, slot: int) -> None:
        # HostTier's double-free check scans the free list (O(slots)); a replay's host tier
        # may hold millions of pages, and check_integrity catches a double free anyway.
        self._free.append(slot)
