"""Continuous batching: which requests run this step, and how many tokens each computes.

Each step, running requests go first (oldest first), each taking the next
tokens it needs: one for a decode, a chunk for a prompt still in prefill.
When pages run out, unreferenced prefix-cache pages are evicted first; if
that is not enough, the newest running request is preempted (newest-first
keeps the work already done on old requests): by recompute (its pages are
released; on resume it re-matches the prefix cache and recomputes the rest)
or by swap (its pages move to the host tier and come back intact). Then
waiting requests are admitted in arrival order while the token budget, the
sequence limit and free pages allow; a prompt longer than the remaining
budget is split (chunked prefill).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import EventBus, RequestPreempted, RequestResumed, now_ns
from kvscope.engine.kv_manager import KVCacheManager
from kvscope.engine.request import Request, Status


@dataclass(slots=True)
class ScheduledBatch:
    requests: list[Request]
    num_new: list[int]  # tokens computed this step, per request
    preempted: list[tuple[Request, str]]  # (victim, "recompute" | "swap")
    resumed: list[tuple[Request, str]]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def emit_changes(self, bus: EventBus, step: int) -> None:
        """The batch's preemptions and resumptions as events (the engine's and a replay's)."""
        for victim, mode in self.preempted:
            bus.emit(
                RequestPreempted(now_ns(), step, victim.request_id, mode, len(victim.host_slots))
            )
        for req, mode in self.resumed:
            bus.emit(RequestResumed(now_ns(), step, req.request_id, mode))


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _ensure(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        missing = self.kv.missing_pages(req, num_tokens) + reserve - self.kv.pool.num_free
        if missing > 0:
            self.kv.reclaim(missing)
        return self.kv.can_grow(req, num_tokens, reserve)

    def _preempt(self, victim: Request) -> str:
        victim.num_preemptions += 1
        if self.config.preemption == "swap" and self.kv.can_swap_out(victim):
            self.kv.swap_out(victim)
            victim.status = Status.SWAPPED
            return "swap"
        self.kv.release(victim)
        victim.num_computed = 0
        victim.status = Status.WAITING
        return "recompute"

    def _steady(self, budget: int) -> ScheduledBatch | None:
        """The batch when nothing changes: every running request takes all the tokens it
        needs within the budget, the free pages cover its growth, and nobody can be admitted
        (nobody waits, or the sequence limit or the budget is reached). Then the loop below
        would schedule exactly this (no reclaim, no preemption, no admission), so it is built
        in one pass; None sends the step down the general path."""
        running = self.running
        num_new = [req.num_tokens - req.num_computed for req in running]
        total = sum(num_new)
        if total > budget:
            return None
        if self.waiting and total < budget and len(running) < self.config.max_num_seqs:
            return None  # a waiting request may be admitted
        kv = self.kv
        ps = kv.page_size
        growing = []
        need = 0
        for req, n in zip(running, num_new, strict=True):
            # Pages needed to hold every computed token after this step (missing_pages).
            missing = -(-(req.num_computed + n) // ps) - len(req.pages)
            if missing > 0:
                growing.append((req, req.num_computed + n))
                need += missing
        if need > kv.pool.num_free:
            return None
        for req, total in growing:
            kv.grow(req, total)
        return ScheduledBatch(list(running), num_new, [], [])

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_batched_tokens
        steady = self._steady(budget)
        if steady is not None:
            return steady
        batch = ScheduledBatch([], [], [], [])
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed, budget)
            while not self._ensure(req, req.num_computed + num_new):
                victim = self.running.pop()
                batch.preempted.append((victim, self._preempt(victim)))
                self.waiting.appendleft(victim)
                if victim is req:
                    break
            if req.status is not Status.RUNNING:
                break
            self.kv.grow(req, req.num_computed + num_new)
            batch.requests.append(req)
            batch.num_new.append(num_new)
            budget -= num_new
            i += 1
        if batch.preempted:
            return batch
        # A small watermark keeps room for running decodes to grow.
        watermark = max(1, len(self.running) // 4) if self.running else 0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            resumed = None
            hit = 0
            if req.status is Status.SWAPPED:
                if self.kv.pool.num_free < len(req.host_slots) + watermark:
                    self.kv.reclaim(len(req.host_slots) + watermark - self.kv.pool.num_free)
                if self.kv.pool.num_free < len(req.host_slots) + watermark:
                    break
                self.kv.swap_in(req)
                req.status = Status.WAITING
                resumed = "swap"
            elif not req.pages:
                hit = self.kv.match_prefix(req)
                resumed = "recompute" if req.num_preemptions else None
            remaining = req.num_tokens - req.num_computed
            num_new = min(remaining, budget)
            fits = num_new == remaining or self.config.chunked_prefill
            if not (fits and self._ensure(req, req.num_computed + num_new, watermark)):
                self.kv.retreat(req)
                break
            self.waiting.popleft()
            self.kv.grow(req, req.num_computed + num_new)
            if resumed != "swap":
                self.kv.admitted(req, hit)
            if resumed:
                batch.resumed.append((req, resumed))
            req.status = Status.RUNNING
            self.running.append(req)
            batch.requests.append(req)
            batch.num_new.append(num_new)
            budget -= num_new
        return batch

    def schedule_ahead(self) -> ScheduledBatch | None:
        """The next batch while a step is still in flight (async scheduling), or None when
        only the serial ``schedule`` may decide it.

        A running request whose computed tokens reach its known ones (``num_computed ==
        num_tokens``) sampled in the step in flight (a decode, or its last prefill chunk):
        it decodes that token next, fed on the device. One whose token finishes it
        whatever its value (max tokens, the context cap) sits this step out. The others
        take their next prefill chunk, and waiting requests are admitted in arrival order
        as ``schedule`` does (vLLM v1's AsyncScheduler does the same): none of their
        tokens depends on the step in flight. Pages come from the free list or from
        evicting cache-only prefix pages (no request holds them, so no step in flight
        reads them but in stream order), never by preempting a request or by a host-tier
        copy: a preemption, a swap-in, an offloading eviction or a reload needs the
        in-flight tokens resolved first (None). A request the in-flight tokens finish
        still counts against the sequence limit, the budget and the pages here, so a step
        ahead admits what the serial one would, at most one step later.
        """
        kv = self.kv
        prefix = kv.prefix
        # Evicting a cache-only page is a free-list move, unless it offloads the page to
        # the host tier (a copy), and a match may reload an offloaded page.
        offloads = self.config.offload != "never"
        if prefix is not None and prefix.host_pages:
            return None
        running = self.running
        budget = self.config.max_batched_tokens
        ps = kv.page_size
        batch = ScheduledBatch([], [], [], [])
        requests, num_new = batch.requests, batch.num_new
        for req in running:
            if budget <= 0:
                break
            n = req.num_tokens - req.num_computed
            if n == 0:
                out = len(req.output_ids) + 1
                if out >= req.params.max_tokens or len(req.prompt_ids) + out >= req.max_len:
                    continue
                n = 1
            else:
                n = min(n, budget)
            total = req.num_computed + n
            if -(-total // ps) > len(req.pages):  # a new page (most decode steps need none)
                if not self._fits_ahead(req, total, 0, offloads):
                    return None  # a preemption: the serial path's (grown pages stay grown)
                kv.grow(req, total)
            requests.append(req)
            num_new.append(n)
            budget -= n
        watermark = max(1, len(running) // 4) if running else 0
        while self.waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.status is Status.SWAPPED or req.pages:
                # A swap-in: the serial path's, unless this step already has rows.
                if batch.requests:
                    break
                return None
            hit = kv.match_prefix(req)
            remaining = req.num_tokens - req.num_computed
            n = min(remaining, budget)
            fits = n == remaining or self.config.chunked_prefill
            if not (fits and self._fits_ahead(req, req.num_computed + n, watermark, offloads)):
                kv.retreat(req)
                break  # as the serial path: the queue waits for pages
            self.waiting.popleft()
            kv.grow(req, req.num_computed + n)
            kv.admitted(req, hit)
            if req.num_preemptions:
                batch.resumed.append((req, "recompute"))
            req.status = Status.RUNNING
            running.append(req)
            batch.requests.append(req)
            batch.num_new.append(n)
            budget -= n
        return batch if batch.requests else None

    def _fits_ahead(self, req: Request, num_tokens: int, reserve: int, offloads: bool) -> bool:
        """Whether ``req`` can hold ``num_tokens`` tokens with ``reserve`` pages to spare,
        evicting cache-only pages when that moves no data (``offloads`` False)."""
        kv = self.kv
        missing = kv.missing_pages(req, num_tokens) + reserve - kv.pool.num_free
        if missing > 0 and not offloads:
            kv.reclaim(missing)
        return kv.can_grow(req, num_tokens, reserve)

    def finish(self, req: Request) -> None:
        self.running.remove(req)
