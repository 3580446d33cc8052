"""A plausible engine event stream without the engine, with its true counters.

A toy paged-KV scheduler (admission by free pages, one page per ``page_size``
tokens, a prefix cache of finished requests' pages, eviction with optional
offload, recompute preemption) emits the same event types as the real engine,
on a synthetic clock. Tests record it and check the database against
``SyntheticRun.truth``; front ends and benchmarks use it as data. Deterministic
for a given seed.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.engine.events import (
    PAGE_CACHED,
    PAGE_EVICTED,
    PAGE_FREE,
    BlockStored,
    ChunkScheduled,
    Event,
    EventBus,
    FirstToken,
    GpuSample,
    KernelTiming,
    PageEvicted,
    PageMap,
    PageOffloaded,
    PageReloaded,
    PagesAllocated,
    PagesFreed,
    PrefixLookup,
    RequestArrived,
    RequestFinished,
    RequestPreempted,
    RequestResumed,
    RequestScheduled,
    StepSummary,
)
from kvscope.profiler.recorder import Recorder


@dataclass(slots=True)
class Truth:
    """What the simulated engine counted itself, to compare a recording against."""

    requests: int = 0
    requests_finished: int = 0
    output_tokens: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    evicted_pages: int = 0
    offloaded_pages: int = 0
    reloaded_pages: int = 0
    preemptions: int = 0
    steps: int = 0
    kernel_calls: dict[str, int] = field(default_factory=dict)
    # step of each PageMap -> pages held by requests (allocated minus freed so far)
    pages_in_use_at_snapshot: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Request:
    rid: int
    prompt: int
    max_tokens: int
    group: int
    arrival_ns: int
    pages: list[int] = field(default_factory=list)
    output: int = 0
    first_ns: int | None = None
    scheduled: bool = False
    preempted: bool = False


class SyntheticRun:
    """Build with parameters, then read ``events`` (a list) and ``truth``."""

    def __init__(
        self,
        start_ns: int,
        *,
        num_requests: int = 40,
        num_pages: int = 64,
        page_size: int = 16,
        page_map_every: int = 5,
        gpu: bool = False,
        offload: bool = True,
        seed: int = 0,
    ) -> None:
        self.rng = random.Random(seed)
        self.page_size = page_size
        self.num_pages = num_pages
        self.owner = np.full(num_pages, PAGE_FREE, dtype=np.int32)
        self.evicted_since_map: set[int] = set()
        self.cached_groups: dict[int, int] = {}  # prefix group -> tokens cached
        self.host_pages = 0
        self.truth = Truth()
        self.events: list[Event] = []
        self._simulate(start_ns, num_requests, page_map_every, gpu, offload)

    # --- page pool ----------------------------------------------------------------

    def _free_pages(self) -> list[int]:
        return [int(p) for p in np.flatnonzero(self.owner == PAGE_FREE)]

    def _evict(self, now: int, step: int, n: int, offload: bool) -> None:
        """Turn up to n cached pages back into free ones (offloading some)."""
        for page in [int(p) for p in np.flatnonzero(self.owner == PAGE_CACHED)][:n]:
            to_host = offload and page % 2 == 0
            self.events.append(
                PageEvicted(now, step, page, "offloaded" if to_host else "dropped", "lru")
            )
            self.truth.evicted_pages += 1
            if to_host:
                self.events.append(PageOffloaded(now, step, page, self.host_pages, 2e-5))
                self.truth.offloaded_pages += 1
                self.host_pages += 1
            self.owner[page] = PAGE_FREE
            self.evicted_since_map.add(page)
        self.cached_groups.clear()

    def _allocate(self, now: int, step: int, req: _Request, n: int) -> bool:
        free = self._free_pages()
        if len(free) < n:
            return False
        pages = free[:n]
        self.owner[pages] = req.rid
        self.evicted_since_map.difference_update(pages)
        req.pages.extend(pages)
        self.events.append(PagesAllocated(now, step, req.rid, tuple(pages)))
        return True

    def _release(self, now: int, step: int, req: _Request, cache: bool) -> None:
        self.events.append(PagesFreed(now, step, req.rid, tuple(req.pages)))
        full = req.prompt // self.page_size if cache else 0
        stored = req.pages[:full]
        self.owner[stored] = PAGE_CACHED
        self.owner[req.pages[full:]] = PAGE_FREE
        if stored:
            self.events.append(BlockStored(now, step, tuple(stored), full * self.page_size))
            self.cached_groups[req.group] = full * self.page_size
        req.pages = []

    # --- the run ------------------------------------------------------------------------

    def _simulate(
        self, start_ns: int, num_requests: int, page_map_every: int, gpu: bool, offload: bool
    ) -> None:
        rng, ps, truth = self.rng, self.page_size, self.truth
        now = start_ns + 1_000_000
        waiting: list[_Request] = []
        running: list[_Request] = []
        arrivals = sorted(rng.randrange(0, num_requests * 2) for _ in range(num_requests))
        next_rid = 0
        step = 0
        while next_rid < num_requests or waiting or running:
            now += 50_000  # the scheduler's turn: after the previous step's page map
            while next_rid < num_requests and arrivals[next_rid] <= step:
                req = _Request(
                    next_rid, rng.randint(ps, 6 * ps), rng.randint(2, 24), rng.randrange(4), now
                )
                self.events.append(RequestArrived(now, step, req.rid, req.prompt, req.max_tokens))
                truth.requests += 1
                waiting.append(req)
                next_rid += 1
            prefill = decode = 0
            # Admit in arrival order while the prompt fits (evicting cached pages if needed).
            while waiting:
                req = waiting[0]
                need = -(-(req.prompt + req.output + 1) // ps)
                if len(self._free_pages()) < need:
                    self._evict(now, step, need - len(self._free_pages()), offload)
                if not self._allocate(now, step, req, need):
                    break
                waiting.pop(0)
                hit = min(self.cached_groups.get(req.group, 0), req.prompt - 1)
                self.events.append(
                    PrefixLookup(now, step, req.rid, req.prompt, hit, preempted=req.preempted)
                )
                if not req.preempted:  # the hit rate counts a request's first lookup only
                    truth.prefix_queried_tokens += req.prompt
                    truth.prefix_hit_tokens += hit
                if req.preempted:
                    self.events.append(RequestResumed(now, step, req.rid, "recompute"))
                if not req.scheduled:
                    self.events.append(RequestScheduled(now, step, req.rid, hit))
                    req.scheduled = True
                # A resumed request recomputes its generated tokens too.
                recompute = req.prompt + req.output - hit
                self.events.append(ChunkScheduled(now, step, req.rid, hit, recompute))
                prefill += recompute
                running.append(req)
            # Decode: one token per running request; a full last page needs a new one,
            # from the free pool, else by evicting a cached page, else by preempting
            # the youngest running request (recompute).
            for req in list(running):
                if req not in running:
                    continue
                if req.prompt + req.output >= len(req.pages) * ps:
                    if not self._free_pages():
                        self._evict(now, step, 1, offload)
                    while not self._allocate(now, step, req, 1):
                        victim = running.pop()
                        self.events.append(
                            RequestPreempted(now, step, victim.rid, "recompute", len(victim.pages))
                        )
                        truth.preemptions += 1
                        self._release(now, step, victim, cache=False)
                        victim.preempted = True
                        waiting.insert(0, victim)
                        if victim is req:
                            break
                    if req not in running:
                        continue
                req.output += 1
                decode += 1
            if self.host_pages and self._free_pages() and rng.random() < 0.2:
                self.host_pages -= 1
                self.events.append(
                    PageReloaded(now, step, self._free_pages()[0], self.host_pages, 3e-5)
                )
                truth.reloaded_pages += 1
            duration_ns = 2_000_000 + 20_000 * (prefill + decode)
            now += duration_ns
            for req in list(running):
                if req.first_ns is None:
                    req.first_ns = now
                    self.events.append(FirstToken(now, step, req.rid, (now - req.arrival_ns) / 1e9))
                if req.output >= req.max_tokens:
                    running.remove(req)
                    tpot = (now - req.first_ns) / 1e9 / max(1, req.output - 1)
                    self._release(now, step, req, cache=True)
                    self.events.append(
                        RequestFinished(
                            now,
                            step,
                            req.rid,
                            req.prompt,
                            req.output,
                            0,
                            "length",
                            (req.first_ns - req.arrival_ns) / 1e9,
                            tpot,
                        )
                    )
                    truth.requests_finished += 1
                    truth.output_tokens += req.output
            self._kernels(now, step, prefill, decode)
            used = int(np.count_nonzero(self.owner >= 0))
            cached = int(np.count_nonzero(self.owner == PAGE_CACHED))
            self.events.append(
                StepSummary(
                    now,
                    step,
                    batch_size=len(running),
                    prefill_tokens=prefill,
                    decode_tokens=decode,
                    running=len(running),
                    waiting=len(waiting),
                    pages_total=self.num_pages,
                    pages_used=used,
                    pages_cached=cached,
                    pages_free=self.num_pages - used - cached,
                    page_size=ps,
                    tokens_held=sum(r.prompt + r.output for r in running),
                    host_pages_used=self.host_pages,
                    duration_s=duration_ns / 1e9,
                )
            )
            if gpu:
                self.events.append(
                    GpuSample(now, step, 0, 50.0, 2 << 30, 80 << 30, 300.0, 1980.0, 1 << 30)
                )
            if step % page_map_every == 0:
                owners = self.owner.copy()
                owners[sorted(self.evicted_since_map)] = PAGE_EVICTED
                self.evicted_since_map.clear()
                self.events.append(PageMap(now, step, owners))
                truth.pages_in_use_at_snapshot[step] = used
            truth.steps += 1
            step += 1

    def _kernels(self, now: int, step: int, prefill: int, decode: int) -> None:
        for name, tokens in (("prefill_attention", prefill), ("paged_decode", decode)):
            if tokens:
                self.events.append(
                    KernelTiming(
                        now,
                        step,
                        name,
                        f"[{tokens},9,64]",
                        1e-4 * tokens,
                        2e6 * tokens,
                        1e5 * tokens,
                    )
                )
                self.truth.kernel_calls[name] = self.truth.kernel_calls.get(name, 0) + 1


def record_synthetic(
    db_path: str | os.PathLike[str],
    config: dict[str, Any] | None = None,
    status: str = "complete",
    **params: Any,
) -> tuple[int, SyntheticRun]:
    """Record a synthetic run through the real Recorder and EventBus; returns
    (run id, the run). ``params`` go to SyntheticRun."""
    recorder = Recorder(db_path, config or {"synthetic": True, **params}, "synthetic", "synthetic")
    bus = EventBus()
    unsubscribe = bus.subscribe(recorder.on_event)
    recorder.start()
    run = SyntheticRun(recorder.start_ns, **params)
    for event in run.events:
        bus.emit(event)
    unsubscribe()
    recorder.finish(status)
    return recorder.run_id, run
