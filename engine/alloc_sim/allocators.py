"""Three ways to give each request room for its KV cache, behind one small interface.

Every allocator holds ``tokens[r]`` tokens of request r in ``slots[r]`` reserved
slots. Admission prefills a request's tokens and reserves room for the token
that prefill produces (its K and V are written by the next step); ``append``
stores one more token and returns False, changing nothing, when there is no room.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from kvscope.engine.alloc_sim.arena import Arena


class Allocator(ABC):
    """Token slots for requests under a fixed budget of ``capacity`` slots."""

    name: ClassVar[str]
    #: The longest request this allocator can hold at all; None for no limit.
    max_tokens: int | None = None

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens: dict[int, int] = {}
        self.slots: dict[int, int] = {}
        self.held = 0
        self.reserved = 0
        self.copied_tokens = 0

    @abstractmethod
    def slots_for(self, tokens: int) -> int:
        """Slots a request that must hold ``tokens`` tokens reserves."""

    @abstractmethod
    def free_slots(self) -> int:
        """Slots that no request has reserved."""

    @abstractmethod
    def extents(self) -> list[tuple[int, int, int]]:
        """Every reserved block as ``(request, first slot, length)``."""

    @abstractmethod
    def _reserve(self, rid: int, slots: int) -> bool:
        """Reserve ``slots`` for a new request; False if there is no room."""

    @abstractmethod
    def _grow(self, rid: int) -> int | None:
        """Room for one more token of a full request: its new slot count, or None."""

    @abstractmethod
    def _unreserve(self, rid: int) -> None:
        """Give back every slot of a request."""

    def admission_slots(self, tokens: int) -> int:
        return self.slots_for(tokens + 1)

    def admit(self, rid: int, tokens: int) -> bool:
        assert rid not in self.tokens, f"request {rid} admitted twice"
        slots = self.admission_slots(tokens)
        if not self._reserve(rid, slots):
            return False
        self.tokens[rid] = tokens
        self.slots[rid] = slots
        self.held += tokens
        self.reserved += slots
        return True

    def append(self, rid: int) -> bool:
        held, slots = self.tokens[rid], self.slots[rid]
        if held == slots:
            grown = self._grow(rid)
            if grown is None:
                return False
            assert grown > slots, "growth must add room"
            self.slots[rid] = grown
            self.reserved += grown - slots
        self.tokens[rid] = held + 1
        self.held += 1
        return True

    def release(self, rid: int) -> None:
        self._unreserve(rid)
        self.held -= self.tokens.pop(rid)
        self.reserved -= self.slots.pop(rid)

    def check_integrity(self) -> None:
        """Assert that blocks never overlap, nothing leaks, and the counters add up."""
        per_request: dict[int, int] = {}
        for rid, _, length in self.extents():
            per_request[rid] = per_request.get(rid, 0) + length
        assert per_request == self.slots, "blocks do not match the requests' reservations"
        assert all(self.tokens[r] <= s for r, s in self.slots.items()), "tokens beyond slots"
        assert sum(self.tokens.values()) == self.held
        assert sum(self.slots.values()) == self.reserved
        self._check_layout()

    @abstractmethod
    def _check_layout(self) -> None:
        """Assert that reserved blocks and free space tile the budget exactly."""


class _ContiguousAllocator(Allocator):
    """One block per request, carved first-fit from an arena; growing means moving."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.arena = Arena(capacity)
        self.starts: dict[int, int] = {}

    def free_slots(self) -> int:
        return self.arena.free

    def extents(self) -> list[tuple[int, int, int]]:
        return [(rid, start, self.slots[rid]) for rid, start in self.starts.items()]

    def _reserve(self, rid: int, slots: int) -> bool:
        start = self.arena.allocate(slots)
        if start is None:
            return False
        self.starts[rid] = start
        return True

    def _grow(self, rid: int) -> int | None:
        # Like realloc without in-place growth: the new block is taken while the
        # old one still holds the tokens, which are then copied over.
        held = self.tokens[rid]
        slots = self.slots_for(held + 1)
        start = self.arena.allocate(slots)
        if start is None:
            return None
        self.arena.release(self.starts[rid], self.slots[rid])
        self.starts[rid] = start
        self.copied_tokens += held
        return slots

    def _unreserve(self, rid: int) -> None:
        self.arena.release(self.starts.pop(rid), self.slots[rid])

    def _check_layout(self) -> None:
        pieces = sorted([(s, n) for _, s, n in self.extents()] + self.arena.holes)
        end = 0
        for start, length in pieces:
            assert start == end, f"slot {min(start, end)} is overlapped or lost"
            end = start + length
        assert end == self.capacity, "the budget's tail is lost"
        assert self.arena.free == sum(n for _, n in self.arena.holes)


class MaxReservationAllocator(_ContiguousAllocator):
    """Every request reserves the maximum length up front (pre-vLLM servers did this)."""

    name = "max_reservation"

    def __init__(self, capacity: int, max_tokens: int) -> None:
        super().__init__(capacity)
        self.max_tokens = max_tokens

    def slots_for(self, tokens: int) -> int:
        return self.max_tokens


class DoublingAllocator(_ContiguousAllocator):
    """A ``std::vector`` per request: capacity a power of two, doubled (and copied) when full."""

    name = "doubling"

    def slots_for(self, tokens: int) -> int:
        return 1 << max(tokens - 1, 0).bit_length()


class PagedAllocator(Allocator):
    """Fixed-size pages from a free list, as in vLLM: a request's pages need not be adjacent."""

    name = "paged"

    def __init__(self, capacity: int, page_size: int = 16) -> None:
        super().__init__(capacity)
        self.page_size = page_size
        self.num_pages = capacity // page_size
        # Pages never handed out are a counter, not a list (a list of every page had
        # made --kv-gib 1e12 a MemoryError and 1e9 tokens take seconds); freed pages
        # are handed out again first, the last freed first, and then low page ids,
        # as popping a list of every page from its end did.
        self.fresh = 0  # pages 0..fresh-1 have been handed out at some time
        self.freed: list[int] = []
        self.pages: dict[int, list[int]] = {}

    def slots_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def _free_pages(self) -> int:
        return len(self.freed) + self.num_pages - self.fresh

    def free_slots(self) -> int:
        return self._free_pages() * self.page_size

    def extents(self) -> list[tuple[int, int, int]]:
        ps = self.page_size
        return [(rid, page * ps, ps) for rid, pages in self.pages.items() for page in pages]

    def _take(self) -> int:
        if self.freed:
            return self.freed.pop()
        self.fresh += 1
        return self.fresh - 1

    def _reserve(self, rid: int, slots: int) -> bool:
        count = slots // self.page_size
        if count > self._free_pages():
            return False
        self.pages[rid] = [self._take() for _ in range(count)]
        return True

    def _grow(self, rid: int) -> int | None:
        if not self._free_pages():
            return None
        self.pages[rid].append(self._take())
        return self.slots[rid] + self.page_size

    def _unreserve(self, rid: int) -> None:
        self.freed.extend(self.pages.pop(rid))

    def _check_layout(self) -> None:
        owned = [p for pages in self.pages.values() for p in pages]
        assert sorted(owned + self.freed) == list(range(self.fresh)), (
            "a page is owned twice, both owned and free, or lost"
        )
