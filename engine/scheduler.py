"""Continuous batching: which requests run this step, and how many tokens each computes.

Each step, running requests go first (oldest first), each taking the next
tokens it needs: one for a decode, a chunk for a prompt still in prefill.
When pages run out, the newest running request is preempted (its pages are
released and it goes back to the front of the queue to be recomputed) until
the older ones fit: newest-first keeps the work already done on old requests.
Then waiting requests are admitted in arrival order while the token budget,
the sequence limit and free pages allow; a prompt longer than the remaining
budget is split (chunked prefill).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.engine_config import EngineConfig
from engine.kv_manager import KVCacheManager
from engine.request import Request, Status


@dataclass(slots=True)
class ScheduledBatch:
    requests: list[Request]
    num_new: list[int]  # tokens computed this step, per request
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Called when a request is admitted for the first time (prefix-cache lookup).
        self.on_admit: Callable[[Request], None] = lambda req: None
        # Called to free pages held by something other than running requests
        # (the prefix cache); returns pages freed.
        self.reclaim: Callable[[int], int] = lambda n: 0
        # Called with each victim; does the release (recompute or swap).
        self.on_preempt: Callable[[Request], None] = self._preempt_recompute

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt_recompute(self, req: Request) -> None:
        self.kv.release(req)
        req.num_computed = 0

    def _ensure(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        missing = self.kv.missing_pages(req, num_tokens) + reserve - self.kv.pool.num_free
        if missing > 0:
            self.reclaim(missing)
        return self.kv.can_grow(req, num_tokens, reserve)

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_batched_tokens
        batch = ScheduledBatch([], [], [])
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed, budget)
            while not self._ensure(req, req.num_computed + num_new):
                victim = self.running.pop()
                victim.status = Status.WAITING
                victim.num_preemptions += 1
                self.on_preempt(victim)
                self.waiting.appendleft(victim)
                batch.preempted.append(victim)
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
        watermark = max(1, len(self.running) // 4)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.status is Status.SWAPPED:
                break  # the swap tier brings it back (engine.offload)
            first_time = req.scheduled_ns is None and req.num_computed == 0 and not req.pages
            if first_time:
                self.on_admit(req)
            remaining = req.num_tokens - req.num_computed
            num_new = min(remaining, budget)
            if num_new < remaining and not self.config.chunked_prefill:
                break
            if not self._ensure(req, req.num_computed + num_new, watermark if self.running else 0):
                break
            self.waiting.popleft()
            self.kv.grow(req, req.num_computed + num_new)
            req.status = Status.RUNNING
            self.running.append(req)
            batch.requests.append(req)
            batch.num_new.append(num_new)
            budget -= num_new
        return batch

    def finish(self, req: Request) -> None:
        self.running.remove(req)
