"""The host tier without tensors: slots and modelled copy times, for replays.

A replay has no KV data to copy, so this keeps only what the radix cache and
the KV manager ask of ``engine.host_tier.HostTier`` (the same methods): which
slots are free, and how long a page's copy over the device's host link takes
(bytes over PCIe bandwidth), which the roofline timing adds to the step.
"""

from __future__ import annotations


class SlotTier:
    def __init__(self, num_slots: int, page_copy_s: float = 0.0) -> None:
        self.num_slots = num_slots
        self.page_copy_s = page_copy_s
        self._free = list(range(num_slots - 1, -1, -1))
        self.copy_s = 0.0  # modelled copy seconds since the driver last took them
        self.stores = self.loads = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def store(self, page: int) -> tuple[int, float]:
        self.stores += 1
        self.copy_s += self.page_copy_s
        return self._free.pop(), self.page_copy_s

    def load(self, slot: int, page: int) -> float:
        self.loads += 1
        self.copy_s += self.page_copy_s
        self.release(slot)
        return self.page_copy_s

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def check_integrity(self, held: set[int]) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "host slot twice in the free list"
        assert not (free & held), "host slot both free and held"
        assert len(free) + len(held) == self.num_slots, "host slots leaked"
