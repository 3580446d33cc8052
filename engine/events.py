"""Typed engine events and the bus that carries them.

Every KV-cache decision and kernel launch becomes one of these small frozen
records. The engine only emits; the profiler, the TUI and tests subscribe.
Emitting with no subscriber costs one attribute check: call sites guard with
``if bus.active:`` before building an event, the way vLLM's null KV-event
publisher makes the feature free when off.

Identifiers: ``request_id`` is the engine's integer id of a request; page ids
are indices into the device page pool; ``host_slot`` indexes the CPU tier.
Timestamps are ``time.monotonic_ns()``; a run records its wall-clock start so
readers can convert.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np


def now_ns() -> int:
    """The clock every event uses (monotonic, nanoseconds)."""
    return time.monotonic_ns()


@dataclass(frozen=True, slots=True)
class Event:
    """Base of all events: when (``ts_ns``), at which engine step, what kind."""

    kind: ClassVar[str] = "event"
    ts_ns: int
    step: int

    def payload(self) -> dict[str, Any]:
        """The event's own fields (without ts/step) as plain JSON-able values."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("ts_ns", "step"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                value = value.tolist()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


# --- request lifecycle -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestArrived(Event):
    kind: ClassVar[str] = "request_arrived"
    request_id: int
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class RequestRejected(Event):
    """A request the engine refused (too long, bad sampling values...)."""

    kind: ClassVar[str] = "request_rejected"
    request_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class RequestScheduled(Event):
    """First admission of a request into the running batch."""

    kind: ClassVar[str] = "request_scheduled"
    request_id: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class FirstToken(Event):
    kind: ClassVar[str] = "first_token"
    request_id: int
    ttft_s: float


@dataclass(frozen=True, slots=True)
class RequestFinished(Event):
    kind: ClassVar[str] = "request_finished"
    request_id: int
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    finish_reason: str
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True, slots=True)
class RequestPreempted(Event):
    kind: ClassVar[str] = "request_preempted"
    request_id: int
    mode: str  # "recompute" | "swap"
    pages_released: int


@dataclass(frozen=True, slots=True)
class RequestResumed(Event):
    kind: ClassVar[str] = "request_resumed"
    request_id: int
    mode: str


@dataclass(frozen=True, slots=True)
class ChunkScheduled(Event):
    """A prefill chunk of ``tokens`` starting at prompt position ``start``."""

    kind: ClassVar[str] = "chunk_scheduled"
    request_id: int
    start: int
    tokens: int


# --- pages ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PagesAllocated(Event):
    kind: ClassVar[str] = "pages_allocated"
    request_id: int
    pages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PagesFreed(Event):
    kind: ClassVar[str] = "pages_freed"
    request_id: int
    pages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PageMap(Event):
    """Snapshot of every page's owner, emitted every N steps.

    ``owners[i]`` is a request id (>= 0) or one of the ``PAGE_*`` codes below.
    A page shared by several requests shows one of them there, so the snapshot
    also carries who holds what exactly (``holds``, see ``encode_holds``) and the
    device pages in the prefix tree (``tree``): with them and the page events
    since, a reader rebuilds holder counts at any step (db/page_states.py).
    """

    kind: ClassVar[str] = "page_map"
    owners: np.ndarray = field(compare=False)
    holds: np.ndarray | None = field(default=None, compare=False)  # int32, encode_holds
    tree: np.ndarray | None = field(default=None, compare=False)  # int32 device pages in the tree


def encode_holds(request_pages: dict[int, list[int]]) -> np.ndarray:
    """Every request's held pages as one flat int32 array:
    ``[request id, n, page_1 .. page_n, request id, n, ...]``."""
    parts = [
        np.concatenate([np.array([rid, len(pages)], np.int64), np.asarray(pages, np.int64)])
        for rid, pages in request_pages.items()
        if len(pages)
    ]
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


PAGE_FREE = -1
PAGE_CACHED = -2  # held by the prefix cache, no running request references it
PAGE_EVICTED = -3  # evicted since the previous snapshot (now free)


# --- prefix cache (vLLM's KV-event vocabulary) ---------------------------------


@dataclass(frozen=True, slots=True)
class PrefixLookup(Event):
    """A request's prefix-cache lookup on admission. ``preempted``: the re-lookup of a
    request preempted by recompute, which the hit rate does not count (vLLM keeps it
    apart too, as ``preempted_queries``/``preempted_hits``): its own pages would hit
    again, and the rate could exceed what unlimited capacity gives."""

    kind: ClassVar[str] = "prefix_lookup"
    request_id: int
    queried_tokens: int
    hit_tokens: int
    preempted: bool = False


@dataclass(frozen=True, slots=True)
class PrefixMiss(Event):
    """Why one admission's missed tokens missed (engine/miss_reasons.py): the four
    reasons sum to its queried minus hit tokens. ``capacity_age_s`` and
    ``capacity_age_steps`` are summed over the ``capacity_pages`` pages: the time
    since each was evicted."""

    kind: ClassVar[str] = "prefix_miss"
    request_id: int
    cold_tokens: int
    capacity_tokens: int
    granularity_tokens: int
    last_tokens: int
    capacity_pages: int
    capacity_age_s: float
    capacity_age_steps: int


@dataclass(frozen=True, slots=True)
class BlockStored(Event):
    """Pages the prefix cache now holds, with ``hashes``: each one's chain hash (its whole
    prefix's content, engine/miss_reasons.py; vLLM's ``block_hashes``). ``copies``: a
    request's pages the cache did not take because it holds the same block already
    (computed at the same time), with ``copy_hashes``. So a recording names each
    request's blocks by content (app/replay_db.py), across evictions and copies."""

    kind: ClassVar[str] = "block_stored"
    pages: tuple[int, ...]
    tokens: int
    hashes: tuple[int, ...] = ()
    copies: tuple[int, ...] = ()
    copy_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BlockRemoved(Event):
    kind: ClassVar[str] = "block_removed"
    pages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared(Event):
    kind: ClassVar[str] = "all_blocks_cleared"


@dataclass(frozen=True, slots=True)
class PageEvicted(Event):
    kind: ClassVar[str] = "page_evicted"
    page: int
    action: str  # "dropped" | "offloaded"
    policy: str


@dataclass(frozen=True, slots=True)
class PageOffloaded(Event):
    kind: ClassVar[str] = "page_offloaded"
    page: int
    host_slot: int
    seconds: float


@dataclass(frozen=True, slots=True)
class PageReloaded(Event):
    kind: ClassVar[str] = "page_reloaded"
    page: int
    host_slot: int
    seconds: float


# --- steps, kernels, GPU ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepSummary(Event):
    """One engine step. ``tokens_held / (pages_used * page_size)`` is token-level usage."""

    kind: ClassVar[str] = "step_summary"
    batch_size: int
    prefill_tokens: int
    decode_tokens: int
    running: int
    waiting: int
    pages_total: int
    pages_used: int
    pages_cached: int
    pages_free: int
    page_size: int
    tokens_held: int
    host_pages_used: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class KernelTiming(Event):
    kind: ClassVar[str] = "kernel_timing"
    name: str
    shape: str
    seconds: float
    flops: float
    bytes: float


@dataclass(frozen=True, slots=True)
class MemoryBudgetMeasured(Event):
    """How the engine split device memory at start-up (vLLM's unified budget), and what
    ``kvscope calc`` predicts for the KV cache on the same device. Byte counts; the
    ``*_measured`` flags say which terms were measured rather than estimated."""

    kind: ClassVar[str] = "memory_budget"
    device: str
    device_bytes: int
    memory_fraction: float
    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_bytes: int
    activations_measured: bool
    overhead_measured: bool
    predicted_kv_bytes: int


@dataclass(frozen=True, slots=True)
class GpuSample(Event):
    kind: ClassVar[str] = "gpu_sample"
    gpu_index: int  # NVML index of the GPU sampled
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_w: float
    sm_clock_mhz: float
    torch_allocated_bytes: int


@dataclass(frozen=True, slots=True)
class InfLLMRetrieval(Event):
    """One step of InfLLM retrieval for one request, summed over layers.

    ``chosen_blocks[i]`` was chosen by ``chosen_layers[i]`` layers; a reload
    copies one block of one layer from the host tier; a hit found it in the
    request's retrieved-block cache.
    """

    kind: ClassVar[str] = "infllm_retrieval"
    request_id: int
    blocks_total: int
    blocks_scored: int
    chosen_blocks: tuple[int, ...]
    chosen_layers: tuple[int, ...]
    blocks_reloaded: int
    cache_hits: int
    resident_bytes: int
    offloaded_bytes: int
    seconds: float


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RequestArrived,
        RequestRejected,
        RequestScheduled,
        FirstToken,
        RequestFinished,
        RequestPreempted,
        RequestResumed,
        ChunkScheduled,
        PagesAllocated,
        PagesFreed,
        PageMap,
        PrefixLookup,
        PrefixMiss,
        BlockStored,
        BlockRemoved,
        AllBlocksCleared,
        PageEvicted,
        PageOffloaded,
        PageReloaded,
        StepSummary,
        KernelTiming,
        MemoryBudgetMeasured,
        GpuSample,
        InfLLMRetrieval,
    )
}

Subscriber = Callable[[Event], None]


class EventBus:
    """Synchronous fan-out of events to subscribers.

    Subscribers must be cheap (the profiler's recorder only enqueues); the bus
    runs them on the emitting thread. ``active`` is False with no subscriber so
    call sites can skip building events entirely.
    """

    __slots__ = ("_subscribers", "active")

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self.active = False

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns a function that removes it."""
        self._subscribers.append(fn)
        self.active = True

        def unsubscribe() -> None:
            if fn in self._subscribers:
                self._subscribers.remove(fn)
            self.active = bool(self._subscribers)

        return unsubscribe

    def emit(self, event: Event) -> None:
        for fn in self._subscribers:
            fn(event)
