"""A line of token slots handed out first-fit, the way a general-purpose heap does.

Contiguous allocators (max reservation, doubling) carve their blocks from it;
freed blocks coalesce with free neighbours, and whatever cannot be coalesced is
the external fragmentation that paging avoids.
"""

from __future__ import annotations

import bisect


class Arena:
    """``capacity`` slots; free space is an address-ordered list of ``(start, length)`` holes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.holes: list[tuple[int, int]] = [(0, capacity)] if capacity > 0 else []
        self.free = capacity

    def allocate(self, length: int) -> int | None:
        """Start of a new block of ``length`` slots in the first hole that fits, or None."""
        for i, (start, size) in enumerate(self.holes):
            if size >= length:
                if size == length:
                    del self.holes[i]
                else:
                    self.holes[i] = (start + length, size - length)
                self.free -= length
                return start
        return None

    def release(self, start: int, length: int) -> None:
        """Return a block, merging it with the holes that touch it."""
        i = bisect.bisect_left(self.holes, (start, 0))
        end = start + length
        assert 0 <= start and end <= self.capacity, "block outside the arena"
        assert i == len(self.holes) or end <= self.holes[i][0], "double free (next hole)"
        assert i == 0 or sum(self.holes[i - 1]) <= start, "double free (previous hole)"
        if i < len(self.holes) and self.holes[i][0] == end:
            end += self.holes.pop(i)[1]
        if i > 0 and sum(self.holes[i - 1]) == start:
            i -= 1
            start = self.holes.pop(i)[0]
        self.holes.insert(i, (start, end - start))
        self.free += length
