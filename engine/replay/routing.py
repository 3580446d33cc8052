"""Several replicas: split the KV capacity over N replayed engines and route each request.

What does a KV-aware router buy over round-robin? Each replica is a whole
``ReplayDriver`` (the engine's own scheduler, KV manager and radix cache) with
1/N of the capacity; a router sends every request of the trace to one of them:

- ``round-robin``: replica i mod N;
- ``least-loaded``: the replica with the fewest tokens still to compute, ties to
  the one given the fewest prompt tokens so far (with sequential timing nothing
  is outstanding, so this balances the tokens routed), then the lowest index;
- ``prefix-aware``: the replica whose cache holds the longest prefix of the
  request (``RadixCache.peek``: no reference taken, no access recorded), ties
  to the least loaded; among the replicas not overloaded only: a replica
  that was given more than ``balance`` (1.25) times the prompt tokens of the
  least given one, plus this request's, is passed over. Without that guard a
  prefix every request shares (a system prompt: block 0 of nearly every
  Mooncake request) sends the whole trace to the first replica that cached
  it, as SGLang's cache-aware router's balance thresholds also prevent.

The result gives the hit rate over all replicas and each replica's, and the
blocks held on more than one replica (the watch page's duplication view):
sampled about ``samples`` times over the replay, each sample counting the
distinct prefixes (chain hashes of the cached pages) held by two or more
replicas and the copies beyond the first (memory spent holding one prefix
twice).

Time: ``sequential`` runs each request to its end on its replica before the
next arrives; ``roofline`` advances every replica to a request's arrival time
before routing it, so the loads a router sees are those of that moment.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import EventBus
from kvscope.engine.replay.config import ROUTINGS, ReplayConfig
from kvscope.engine.replay.driver import Prepared, ReplayDriver, prepare
from kvscope.engine.replay.tokens import PageTokens
from kvscope.engine.replay.traces import ReplayTrace

BALANCE = 1.25  # prefix-aware passes over replicas given more than this x the least given


@dataclass(slots=True)
class ReplicaFigures:
    requests: int
    queried_tokens: int
    hit_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


@dataclass(slots=True)
class RoutingResult:
    routing: str
    replicas: list[ReplicaFigures]
    capacity_tokens: int | None  # the whole capacity, before the split
    duplicated_blocks: float  # mean over samples: prefixes held on two or more replicas
    extra_copies: float  # mean over samples: cached copies beyond the first of each prefix
    cached_blocks: float  # mean over samples: cached pages over all replicas
    final_duplicated_blocks: int  # at the end of the replay
    samples: int
    wall_s: float
    rejected: int = 0  # requests no replica could admit (ReplayDriver's refusals)
    assignment: list[int] = field(default_factory=list)  # the replica of each request

    @property
    def queried_tokens(self) -> int:
        return sum(r.queried_tokens for r in self.replicas)

    @property
    def hit_tokens(self) -> int:
        return sum(r.hit_tokens for r in self.replicas)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def duplicated_share(self) -> float:
        """Of the cached pages, the share that are copies of a prefix another replica holds."""
        return self.extra_copies / self.cached_blocks if self.cached_blocks else 0.0

    def summary(self) -> dict:
        return {
            "routing": self.routing,
            "replicas": len(self.replicas),
            "capacity_tokens": self.capacity_tokens,
            "hit_rate": self.hit_rate,
            "queried_tokens": self.queried_tokens,
            "hit_tokens": self.hit_tokens,
            "per_replica": [
                {
                    "requests": r.requests,
                    "queried_tokens": r.queried_tokens,
                    "hit_tokens": r.hit_tokens,
                    "hit_rate": r.hit_rate,
                }
                for r in self.replicas
            ],
            "duplicated_blocks": self.duplicated_blocks,
            "extra_copies": self.extra_copies,
            "cached_blocks": self.cached_blocks,
            "duplicated_share": self.duplicated_share,
            "final_duplicated_blocks": self.final_duplicated_blocks,
            "samples": self.samples,
            "wall_s": self.wall_s,
            "rejected": self.rejected,
        }


class Router:
    """Chooses a replica for each request; ``routed[i]`` is the prompt tokens sent to i."""

    def __init__(self, routing: str, drivers: list[ReplayDriver], balance: float = BALANCE) -> None:
        if routing not in ROUTINGS:
            raise KvscopeError(f"routing must be one of {', '.join(ROUTINGS)}")
        self.routing = routing
        self.balance = balance
        self.drivers = drivers
        self.routed = [0] * len(drivers)
        self._next = 0

    def _load(self, i: int) -> tuple[int, int, int]:
        outstanding = sum(
            len(r.prompt_ids) + r.params.max_tokens - r.num_computed
            for r in self.drivers[i].requests.values()
        )
        return (outstanding, self.routed[i], i)

    def choose(self, tokens: PageTokens) -> int:
        n = len(self.drivers)
        if self.routing == "round-robin":
            choice, self._next = self._next, (self._next + 1) % n
        elif self.routing == "least-loaded":
            choice = min(range(n), key=self._load)
        else:
            most = self.balance * min(self.routed) + len(tokens)
            fair = [i for i in range(n) if self.routed[i] <= most]
            cached = {i: self.drivers[i].cache.peek(tokens) for i in fair}
            choice = min(fair, key=lambda i: (-cached[i], *self._load(i)))
        self.routed[choice] += len(tokens)
        return choice


def _duplication(drivers: list[ReplayDriver]) -> tuple[int, int, int]:
    """(prefixes on two or more replicas, copies beyond the first, cached pages) now."""
    held: Counter[int] = Counter()
    for d in drivers:
        held.update(d.cache.device_chains())
    copies = sum(held.values())
    return sum(1 for c in held.values() if c > 1), copies - len(held), copies


def replay_replicas(
    trace: ReplayTrace,
    config: ReplayConfig,
    replicas: int,
    routing: str,
    prepared: Prepared | None = None,
    buses: list[EventBus] | None = None,
    samples: int = 20,
    progress: Callable[[int, int], None] | None = None,
) -> RoutingResult:
    """Replay ``trace`` over ``replicas`` engines of ``config.capacity_tokens / replicas``
    each, routed by ``routing``; ``buses`` (one per replica) to record them."""
    if replicas < 1:
        raise KvscopeError("--replicas must be at least 1")
    if routing not in ROUTINGS:
        raise KvscopeError(f"routing must be one of {', '.join(ROUTINGS)}")
    cap = config.capacity_tokens
    each = None if cap is None else cap // replicas
    if each is not None and each < config.page_size:
        raise KvscopeError(
            f"a capacity of {cap} tokens over {replicas} replicas is {each} tokens each, "
            f"less than one page of {config.page_size}"
        )
    t0 = time.perf_counter()
    belady = config.eviction_policy == "belady"
    if prepared is None or prepared.page_size != config.page_size or (belady and not prepared.uses):
        prepared = prepare(trace, config.page_size, belady)
    each_config = replace(config, capacity_tokens=each)
    drivers = [
        ReplayDriver(trace, each_config, buses[i] if buses else None, prepared)
        for i in range(replicas)
    ]
    router = Router(routing, drivers)
    entries = trace.entries
    n = len(entries)
    every = max(1, n // max(1, samples))
    assignment: list[int] = []
    dup = extra = cached = 0
    taken = 0
    sequential = config.timing == "sequential"
    arrivals = [e.arrival_s / config.speed for e in entries]
    for i in range(n):
        if not sequential:
            t = arrivals[i]
            for d in drivers:  # every replica catches up to this arrival
                d._next_arrival = t
                while d.has_work() and d.now_s < t:
                    d.step()
                d.now_s = max(d.now_s, t)
        tokens = PageTokens(prepared.keys[i], entries[i].input_len, prepared.space)
        r = router.choose(tokens)
        assignment.append(r)
        d = drivers[r]
        d.add(i)
        if sequential:
            while d.has_work():
                d.step()
        if (i + 1) % every == 0:
            a, b, c = _duplication(drivers)
            dup, extra, cached, taken = dup + a, extra + b, cached + c, taken + 1
        if progress is not None and i % every == 0:
            progress(i + 1, n)
    for d in drivers:
        d._next_arrival = None
        while d.has_work():
            d.step()
    final_dup = _duplication(drivers)[0]
    counts = Counter(assignment)
    figures = [
        ReplicaFigures(counts[i], d.kv.prefix_queried_tokens, d.kv.prefix_hit_tokens)
        for i, d in enumerate(drivers)
    ]
    taken = max(1, taken)
    return RoutingResult(
        routing=routing,
        replicas=figures,
        capacity_tokens=cap,
        duplicated_blocks=dup / taken,
        extra_copies=extra / taken,
        cached_blocks=cached / taken,
        final_duplicated_blocks=final_dup,
        samples=taken,
        wall_s=time.perf_counter() - t0,
        rejected=sum(d.rejected for d in drivers),
        assignment=assignment,
    )


__all__ = ["ROUTINGS", "ReplicaFigures", "Router", "RoutingResult", "replay_replicas"]
