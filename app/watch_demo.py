"""A short recorded ``kvscope watch`` of a synthetic vLLM deployment, for screenshots and
front-end tests: no engine, but the real wire and the real recorder.

Four data-parallel ranks, each an ``EventPublisher`` framing exactly as vLLM's
ZmqEventPublisher, serve a chat workload whose requests share a few system
prompts: every rank caches the shared prefixes (the same blocks held on
several replicas), evicts its oldest blocks when its cache is full (some to
the CPU tier first), and one rank loses a few batches that kvscope replays.
"""

from __future__ import annotations

import random
import time
from collections import deque
from pathlib import Path
from typing import Any

from kvscope.profiler.watch.publisher import EventPublisher, vllm_block_removed, vllm_block_stored
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import SourceSpec

BLOCK_SIZE = 16


class _Rank:
    """One rank's cache: GPU blocks oldest first, evicted to a small CPU tier."""

    def __init__(self, pub: EventPublisher, capacity: int, cpu_capacity: int) -> None:
        self.pub = pub
        self.capacity = capacity
        self.cpu_capacity = cpu_capacity
        self.gpu: deque[int] = deque()
        self.cpu: deque[int] = deque()

    def serve(self, chain: list[int]) -> None:
        """Store the request's blocks not cached yet, evicting the oldest to make room."""
        events: list[Any] = []
        new = [(i, h) for i, h in enumerate(chain) if h not in self.gpu]
        for i, h in new:
            parent = chain[i - 1] if i else None
            while len(self.gpu) >= self.capacity:
                old = self.gpu.popleft()
                events.append(vllm_block_removed([old]))
                if len(self.cpu) >= self.cpu_capacity:
                    events.append(vllm_block_removed([self.cpu.popleft()], "CPU"))
                self.cpu.append(old)
                events.append(vllm_block_stored([old], None, block_size=BLOCK_SIZE, medium="CPU"))
            self.gpu.append(h)
            events.append(vllm_block_stored([h], parent, block_size=BLOCK_SIZE))
        if events:
            self.pub.publish(events)


def record_watch_demo(
    db: Path, *, ranks: int = 4, requests: int = 160, seconds: float = 4.0
) -> int:
    """Record the demo deployment into ``db``; returns the watch run's id."""
    rng = random.Random(7)
    pubs = [
        EventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", dp_rank=r)
        for r in range(ranks)
    ]
    try:
        specs = [SourceSpec(p.endpoint, p.replay_endpoint, dp_rank=r) for r, p in enumerate(pubs)]
        session = WatchSession(db, specs, config={"demo": "synthetic vLLM, data parallel"})
        session.start()
        for pub in pubs:
            pub.wait_for_subscribers()
        cache = [_Rank(p, capacity=96, cpu_capacity=48) for p in pubs]
        systems = [[rng.getrandbits(64) for _ in range(n)] for n in (12, 6, 3)]
        for i in range(requests):
            system = systems[min(2, int(rng.expovariate(1.2)))]
            user = [rng.getrandbits(64) for _ in range(rng.randint(2, 8))]
            if i == requests // 2:
                cache[1].pub.drop_next(3)  # lost on the wire, recovered by replay
            cache[rng.randrange(ranks)].serve(system + user)
            time.sleep(seconds / requests)
        deadline = time.monotonic() + 10
        sent = sum(p.seq for p in pubs)
        while session.status().batches < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        session.stop()
        return session.run_id
    finally:
        for pub in pubs:
            pub.close()
