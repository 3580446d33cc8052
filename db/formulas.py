"""The derived-metric formulas, written once.

Both the live metrics (``profiler.metrics``, from the event stream) and the read
API (``db.queries``, from the database) reduce their input to the same counters
and call these functions, so a figure shown during a run and the same figure
replayed from the database cannot disagree. They live in ``db`` because the
read API must not import the profiler.

Every rate is a ratio of counters over a window, never an average of ratios.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None when there is nothing to divide by."""
    return numerator / denominator if denominator else None


def page_usage(pages_used: float, pages_total: float) -> float | None:
    """Page-level usage (vLLM's ``kv_cache_usage_perc``): pages held by requests / all pages."""
    return ratio(pages_used, pages_total)


def token_slots(pages_used: int, page_size: int) -> int:
    """Token slots reserved by the used pages."""
    return pages_used * page_size


def token_usage(tokens_held: float, slots: float) -> float | None:
    """Token-level usage: tokens held / token slots of the used pages (engine.events.StepSummary)."""
    return ratio(tokens_held, slots)


def internal_fragmentation(slots: float, tokens_held: float) -> float:
    """Reserved token slots that hold no token (the tail of each request's last page)."""
    return slots - tokens_held


def hit_rate(hit_tokens: float, queried_tokens: float) -> float | None:
    """Prefix-cache hit rate: hit tokens / queried tokens."""
    return ratio(hit_tokens, queried_tokens)


def per_second(count: float, seconds: float) -> float | None:
    return ratio(count, seconds)


def step_gap_s(prev_ts_ns: int | None, ts_ns: int, duration_s: float) -> float:
    """Wall time a step accounts for: since the previous step's summary (idle time
    included), or its own duration for the first step. Token rates divide by the
    sum of these gaps, so they are wall-clock throughput at any bucket width."""
    return duration_s if prev_ts_ns is None else (ts_ns - prev_ts_ns) / 1e9


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100, linear interpolation), or None for no values."""
    array = np.fromiter(values, dtype=np.float64)
    return float(np.percentile(array, q)) if array.size else None


def tflops(flops: float, seconds: float) -> float | None:
    return ratio(flops / 1e12, seconds)


def gbps(nbytes: float, seconds: float) -> float | None:
    return ratio(nbytes / 1e9, seconds)


@dataclass(frozen=True, slots=True)
class KernelStat:
    """One kernel's totals and its achieved throughput against the device's peak."""

    name: str
    calls: int
    total_s: float
    mean_s: float
    tflops: float | None
    gbps: float | None
    peak_tflops_frac: float | None  # None when the device's peak is unknown
    peak_gbps_frac: float | None


def kernel_stat(
    name: str,
    calls: int,
    seconds: float,
    flops: float,
    nbytes: float,
    peak_tflops: float | None = None,
    peak_gbps: float | None = None,
) -> KernelStat:
    achieved_tflops = tflops(flops, seconds)
    achieved_gbps = gbps(nbytes, seconds)
    return KernelStat(
        name=name,
        calls=calls,
        total_s=seconds,
        mean_s=seconds / calls if calls else 0.0,
        tflops=achieved_tflops,
        gbps=achieved_gbps,
        peak_tflops_frac=ratio(achieved_tflops, peak_tflops or 0)
        if achieved_tflops is not None
        else None,
        peak_gbps_frac=ratio(achieved_gbps, peak_gbps or 0) if achieved_gbps is not None else None,
    )


@dataclass(slots=True)
class RunTotals:
    """The counters a run summary is computed from (live or replayed)."""

    requests: int = 0
    requests_finished: int = 0
    requests_rejected: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0  # last step summary's time since the run's start
    ttfts: list[float] = field(default_factory=list)
    # (output_tokens, tpot_s) of finished requests; TPOT needs two tokens or more
    tpots: list[tuple[int, float]] = field(default_factory=list)
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    evicted_pages: int = 0
    offloaded_pages: int = 0
    reloaded_pages: int = 0
    preemptions: int = 0
    steps: int = 0
    peak_page_usage: float | None = None
    tokens_held: int = 0  # summed over steps
    token_slots: int = 0  # summed over steps
    dropped_events: int = 0


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The headline figures of one run."""

    run_id: int | None
    status: str
    requests: int
    requests_finished: int
    requests_rejected: int
    output_tokens: int
    elapsed_s: float
    tokens_per_s: float | None  # output tokens / elapsed wall time
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    prefix_hit_rate: float | None
    evicted_pages: int
    offloaded_pages: int
    reloaded_pages: int
    preemptions: int
    steps: int
    peak_page_usage: float | None
    mean_token_usage: float | None
    dropped_events: int


def summarize(run_id: int | None, status: str, totals: RunTotals) -> RunSummary:
    tpots = [tpot for output_tokens, tpot in totals.tpots if output_tokens > 1]
    return RunSummary(
        run_id=run_id,
        status=status,
        requests=totals.requests,
        requests_finished=totals.requests_finished,
        requests_rejected=totals.requests_rejected,
        output_tokens=totals.output_tokens,
        elapsed_s=totals.elapsed_s,
        tokens_per_s=per_second(totals.output_tokens, totals.elapsed_s),
        ttft_p50_s=percentile(totals.ttfts, 50),
        ttft_p99_s=percentile(totals.ttfts, 99),
        tpot_p50_s=percentile(tpots, 50),
        prefix_queried_tokens=totals.prefix_queried_tokens,
        prefix_hit_tokens=totals.prefix_hit_tokens,
        prefix_hit_rate=hit_rate(totals.prefix_hit_tokens, totals.prefix_queried_tokens),
        evicted_pages=totals.evicted_pages,
        offloaded_pages=totals.offloaded_pages,
        reloaded_pages=totals.reloaded_pages,
        preemptions=totals.preemptions,
        steps=totals.steps,
        peak_page_usage=totals.peak_page_usage,
        mean_token_usage=token_usage(totals.tokens_held, totals.token_slots),
        dropped_events=totals.dropped_events,
    )
