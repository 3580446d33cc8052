"""Replay a request trace through three KV allocators under one budget, in pure Python.

Reserve-for-max-length, grow-by-doubling (a ``std::vector`` per request) and
paged allocation are compared on the same trace, so the waste that paging removes
(internal fragmentation inside reservations, external fragmentation between
them, copies on growth) is measured rather than asserted.
"""

from __future__ import annotations

from kvscope.engine.alloc_sim.allocators import (
    Allocator,
    DoublingAllocator,
    MaxReservationAllocator,
    PagedAllocator,
)
from kvscope.engine.alloc_sim.arena import Arena
from kvscope.engine.alloc_sim.replay import SimResult, Timeline, replay

__all__ = [
    "Allocator",
    "Arena",
    "DoublingAllocator",
    "MaxReservationAllocator",
    "PagedAllocator",
    "SimResult",
    "Timeline",
    "replay",
]
