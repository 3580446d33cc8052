"""Derived metrics, live, from the event stream: for the TUI during a run, the final
summary, and the Prometheus exposition.

``LiveMetrics.on_event`` is an EventBus subscriber that only adds to counters;
figures are computed on demand with ``db.formulas``, the same functions the
read API applies to the database, so ``LiveMetrics.summary()`` equals
``db.queries.run_summary`` for the same run.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvscope.db import formulas
from kvscope.db.formulas import KernelStat, RunSummary, RunTotals
from kvscope.db.schema import RUNNING
from kvscope.engine.events import (
    Event,
    FirstToken,
    KernelTiming,
    PageEvicted,
    PageOffloaded,
    PageReloaded,
    PrefixLookup,
    RequestArrived,
    RequestFinished,
    RequestPreempted,
    RequestRejected,
    StepSummary,
    now_ns,
)

# vLLM's bucket bounds, so dashboards built for vLLM read ours the same way.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class Histogram:
    """A Prometheus-style histogram: counts per upper bound, plus sum and count."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) pairs, ending with (inf, count)."""
        total = 0
        out = []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True, slots=True)
class WindowRates:
    """Rates over the last ``seconds`` of step summaries (counters over a window)."""

    seconds: float
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    hit_rate: float | None
    evictions_per_s: float | None
    offloads_per_s: float | None
    reloads_per_s: float | None
    preemptions_per_s: float | None


# Cumulative counters snapshotted at every step summary, for WindowRates.
_WINDOW_COUNTERS = (
    "prefill_tokens",
    "decode_tokens",
    "prefix_queried_tokens",
    "prefix_hit_tokens",
    "evicted_pages",
    "offloaded_pages",
    "reloaded_pages",
    "preemptions",
)


class LiveMetrics:
    """Counters of a run as its events go by, and the figures derived from them.

    ``start_ns`` is the run's start on the event clock (the recorder's
    ``start_ns`` when both run, so elapsed times agree). ``peak_tflops`` and
    ``peak_gbps`` are the device's, for kernel throughput against peak.
    """

    def __init__(
        self,
        start_ns: int | None = None,
        peak_tflops: float | None = None,
        peak_gbps: float | None = None,
        history: int = 10_000,
    ) -> None:
        self.start_ns = now_ns() if start_ns is None else start_ns
        self.peak_tflops = peak_tflops
        self.peak_gbps = peak_gbps
        self.totals = RunTotals()
        self.last_step: StepSummary | None = None
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.inter_token_latency = Histogram(ITL_BUCKETS_S)
        self._ttfts: dict[int, float] = {}  # request -> TTFT; RequestFinished's value wins
        self._kernels: dict[str, list[float]] = {}  # name -> [calls, seconds, flops, bytes]
        self._history: deque[tuple[int, tuple[int, ...]]] = deque(maxlen=history)
        self._handlers: dict[type[Event], Callable] = {
            RequestArrived: self._arrived,
            RequestRejected: self._rejected,
            FirstToken: self._first_token,
            RequestFinished: self._finished,
            RequestPreempted: self._preempted,
            PrefixLookup: self._lookup,
            PageEvicted: self._evicted,
            PageOffloaded: self._offloaded,
            PageReloaded: self._reloaded,
            StepSummary: self._step,
            KernelTiming: self._kernel,
        }

    def on_event(self, event: Event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    # --- counters ---------------------------------------------------------------

    def _arrived(self, event: RequestArrived) -> None:
        self.totals.requests += 1

    def _rejected(self, event: RequestRejected) -> None:
        self.totals.requests_rejected += 1

    def _first_token(self, event: FirstToken) -> None:
        self._ttfts[event.request_id] = event.ttft_s
        self.ttft.observe(event.ttft_s)

    def _finished(self, event: RequestFinished) -> None:
        t = self.totals
        t.requests_finished += 1
        t.output_tokens += event.output_tokens
        t.tpots.append((event.output_tokens, event.tpot_s))
        self._ttfts[event.request_id] = event.ttft_s

    def _preempted(self, event: RequestPreempted) -> None:
        self.totals.preemptions += 1

    def _lookup(self, event: PrefixLookup) -> None:
        if event.preempted:  # a re-lookup: the hit rate counts each request once
            return
        self.totals.prefix_queried_tokens += event.queried_tokens
        self.totals.prefix_hit_tokens += event.hit_tokens

    def _evicted(self, event: PageEvicted) -> None:
        self.totals.evicted_pages += 1

    def _offloaded(self, event: PageOffloaded) -> None:
        self.totals.offloaded_pages += 1

    def _reloaded(self, event: PageReloaded) -> None:
        self.totals.reloaded_pages += 1

    def _step(self, event: StepSummary) -> None:
        t = self.totals
        previous = self.last_step
        gap = formulas.step_gap_s(
            previous.ts_ns if previous else None, event.ts_ns, event.duration_s
        )
        if event.decode_tokens:
            # Every decoding request got its next token one step gap after its last.
            self.inter_token_latency.observe(gap, event.decode_tokens)
        t.steps += 1
        t.elapsed_s = (event.ts_ns - self.start_ns) / 1e9
        slots = formulas.token_slots(event.pages_used, event.page_size)
        t.tokens_held += event.tokens_held
        t.token_slots += slots
        usage = formulas.page_usage(event.pages_used, event.pages_total)
        if usage is not None and (t.peak_page_usage is None or usage > t.peak_page_usage):
            t.peak_page_usage = usage
        self.prefill_tokens += event.prefill_tokens
        self.decode_tokens += event.decode_tokens
        self.last_step = event
        self._history.append((event.ts_ns, self._window_counters()))

    def _kernel(self, event: KernelTiming) -> None:
        k = self._kernels.get(event.name)
        if k is None:
            self._kernels[event.name] = k = [0, 0.0, 0.0, 0.0]
        k[0] += 1
        k[1] += event.seconds
        k[2] += event.flops
        k[3] += event.bytes

    def _window_counters(self) -> tuple[int, ...]:
        t = self.totals
        return (
            self.prefill_tokens,
            self.decode_tokens,
            t.prefix_queried_tokens,
            t.prefix_hit_tokens,
            t.evicted_pages,
            t.offloaded_pages,
            t.reloaded_pages,
            t.preemptions,
        )

    # --- figures -------------------------------------------------------------------

    def summary(self, status: str = RUNNING, dropped_events: int = 0) -> RunSummary:
        """The run's headline figures so far (as db.queries.run_summary computes them)."""
        totals = dataclasses.replace(
            self.totals,
            ttfts=list(self._ttfts.values()),
            tpots=list(self.totals.tpots),
            dropped_events=dropped_events,
        )
        return formulas.summarize(None, status, totals)

    def page_usage(self) -> float | None:
        """Page-level usage at the latest step (vLLM's kv_cache_usage_perc)."""
        s = self.last_step
        return formulas.page_usage(s.pages_used, s.pages_total) if s else None

    def token_usage(self) -> float | None:
        """Token-level usage at the latest step: tokens held / slots of the used pages."""
        s = self.last_step
        if s is None:
            return None
        return formulas.token_usage(s.tokens_held, formulas.token_slots(s.pages_used, s.page_size))

    def fragmentation_slots(self) -> int | None:
        """Reserved but empty token slots at the latest step."""
        s = self.last_step
        if s is None:
            return None
        return int(
            formulas.internal_fragmentation(
                formulas.token_slots(s.pages_used, s.page_size), s.tokens_held
            )
        )

    def window(self, seconds: float = 10.0) -> WindowRates | None:
        """Rates over the step summaries of the last ``seconds`` (None before two steps)."""
        if len(self._history) < 2:
            return None
        end_ns, end = self._history[-1]
        cutoff = end_ns - int(seconds * 1e9)
        start_ns, start = self._history[0]
        for ts_ns, counters in reversed(self._history):
            start_ns, start = ts_ns, counters
            if ts_ns <= cutoff:
                break
        dt = (end_ns - start_ns) / 1e9
        d = dict(
            zip(_WINDOW_COUNTERS, (b - a for a, b in zip(start, end, strict=True)), strict=True)
        )
        return WindowRates(
            seconds=dt,
            prefill_tokens_per_s=formulas.per_second(d["prefill_tokens"], dt),
            decode_tokens_per_s=formulas.per_second(d["decode_tokens"], dt),
            hit_rate=formulas.hit_rate(d["prefix_hit_tokens"], d["prefix_queried_tokens"]),
            evictions_per_s=formulas.per_second(d["evicted_pages"], dt),
            offloads_per_s=formulas.per_second(d["offloaded_pages"], dt),
            reloads_per_s=formulas.per_second(d["reloaded_pages"], dt),
            preemptions_per_s=formulas.per_second(d["preemptions"], dt),
        )

    def kernel_stats(self) -> list[KernelStat]:
        """Per kernel name, most total time first (as db.queries.kernel_stats)."""
        stats = [
            formulas.kernel_stat(name, int(c), s, f, b, self.peak_tflops, self.peak_gbps)
            for name, (c, s, f, b) in self._kernels.items()
        ]
        return sorted(stats, key=lambda k: k.total_s, reverse=True)
