"""Step a trace through one allocator, as a continuous-batching scheduler would.

Each step, running requests (oldest first) each store one token; one that finds
no room preempts the newest running request, which goes back to the head of the
queue and recomputes its tokens when readmitted (vLLM's default). Then waiting
requests are admitted first-come first-served until one does not fit. A request
leaves when it holds prompt + output tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

from kvscope.engine.alloc_sim.allocators import Allocator
from kvscope.engine.errors import KvscopeError
from kvscope.engine.traces import TraceRequest


@dataclass(slots=True)
class Timeline:
    """Per-step samples, taken after the step's decode and admissions."""

    held: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    #: every reserved block as (request, first slot, length) at the last sample,
    #: before the last requests finish: the run's last page map.
    last_extents: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass(slots=True)
class SimResult:
    """What one allocator achieved on a trace. Shares are fractions in [0, 1]."""

    allocator: str
    capacity_slots: int
    requests: int
    steps: int
    #: mean tokens held / mean slots reserved: 1 - internal fragmentation.
    utilization: float
    #: mean tokens held / the whole budget.
    memory_utilization: float
    internal_fragmentation: float
    #: mean share of the budget that was free while the queue's head did not fit
    #: although the free slots added up to what it needed.
    external_fragmentation: float
    max_batch: int
    mean_batch: float
    max_waiting: int
    mean_waiting: float
    preemptions: int
    recomputed_tokens: int
    tokens_copied: int
    bytes_copied: int
    timeline: Timeline

    def summary(self) -> dict[str, int | float | str]:
        """Every figure except the timeline, as a plain dict."""
        figures = asdict(self)
        del figures["timeline"]
        return figures


def _check_fits(trace: list[TraceRequest], allocator: Allocator) -> None:
    for i, request in enumerate(trace):
        total = request.total_len
        if allocator.max_tokens is not None and total > allocator.max_tokens:
            raise KvscopeError(
                f"request {i} ({total} tokens) is longer than the maximum length "
                f"{allocator.max_tokens}"
            )
        need = allocator.slots_for(total)
        if need > allocator.capacity:
            raise KvscopeError(
                f"request {i} ({total} tokens) needs {need} slots under {allocator.name}, "
                f"more than the budget of {allocator.capacity}"
            )


def replay(
    trace: list[TraceRequest],
    allocator: Allocator,
    *,
    step_s: float = 0.025,
    kv_bytes_per_token: float = 0.0,
    check_every_step: bool = False,
) -> SimResult:
    """Run ``trace`` to completion; arrivals are rounded down to steps of ``step_s``."""
    if not trace:
        raise KvscopeError("the trace has no requests")
    _check_fits(trace, allocator)
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
    arrivals = deque((int(trace[i].arrival_s / step_s), i) for i in order)
    tokens = [r.prompt_len for r in trace]
    preempted = [False] * len(trace)
    waiting: deque[int] = deque()
    running: list[int] = []
    timeline = Timeline()
    stranded = preemptions = recomputed = 0
    step = 0
    while arrivals or waiting or running:
        if not waiting and not running:
            step = max(step, arrivals[0][0])  # skip idle time
        while arrivals and arrivals[0][0] <= step:
            waiting.append(arrivals.popleft()[1])

        i = 0
        while i < len(running):
            rid = running[i]
            if allocator.append(rid):
                tokens[rid] += 1
                i += 1
                continue
            victim = running.pop()
            allocator.release(victim)
            waiting.appendleft(victim)
            preempted[victim] = True
            preemptions += 1

        while waiting and allocator.admit(waiting[0], tokens[waiting[0]]):
            rid = waiting.popleft()
            running.append(rid)
            if preempted[rid]:
                recomputed += tokens[rid]

        free = allocator.free_slots()
        if waiting and free >= allocator.admission_slots(tokens[waiting[0]]):
            stranded += free
        timeline.held.append(allocator.held)
        timeline.reserved.append(allocator.reserved)
        timeline.running.append(len(running))
        timeline.waiting.append(len(waiting))
        if check_every_step:
            allocator.check_integrity()

        done = [r for r in running if tokens[r] == trace[r].total_len]
        if len(done) == len(running) and not arrivals and not waiting:
            timeline.last_extents = allocator.extents()  # the last sample's layout
        for rid in done:
            allocator.release(rid)
            running.remove(rid)
        step += 1

    steps = len(timeline.held)
    held, reserved = sum(timeline.held), sum(timeline.reserved)
    utilization = held / reserved
    return SimResult(
        allocator=allocator.name,
        capacity_slots=allocator.capacity,
        requests=len(trace),
        steps=steps,
        utilization=utilization,
        memory_utilization=held / (steps * allocator.capacity),
        internal_fragmentation=1 - utilization,
        external_fragmentation=stranded / (steps * allocator.capacity),
        max_batch=max(timeline.running),
        mean_batch=sum(timeline.running) / steps,
        max_waiting=max(timeline.waiting),
        mean_waiting=sum(timeline.waiting) / steps,
        preemptions=preemptions,
        recomputed_tokens=recomputed,
        tokens_copied=allocator.copied_tokens,
        bytes_copied=round(allocator.copied_tokens * kv_bytes_per_token),
        timeline=timeline,
    )
