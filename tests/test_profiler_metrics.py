"""Live metrics from the event stream equal the same figures replayed from the database."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvscope.db import queries
from kvscope.engine.events import EventBus, FirstToken, PageEvicted, PrefixLookup, StepSummary
from kvscope.profiler.metrics import Histogram, LiveMetrics
from kvscope.profiler.recorder import Recorder
from kvscope.profiler.synthetic import SyntheticRun


def _step(
    step: int, ts_s: float, *, decode: int = 4, used: int = 10, held: int = 150
) -> StepSummary:
    return StepSummary(
        ts_ns=int(ts_s * 1e9),
        step=step,
        batch_size=decode,
        prefill_tokens=0,
        decode_tokens=decode,
        running=decode,
        waiting=1,
        pages_total=40,
        pages_used=used,
        pages_cached=5,
        pages_free=25,
        page_size=16,
        tokens_held=held,
        host_pages_used=0,
        duration_s=0.05,
    )


def test_live_summary_and_kernel_stats_equal_the_databases(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    hardware = {"peak_tflops": 0.1, "peak_gbps": 4.0}
    rec = Recorder(path, {}, "m", hardware=hardware, versions={})
    live = LiveMetrics(rec.start_ns, peak_tflops=0.1, peak_gbps=4.0)
    bus = EventBus()
    bus.subscribe(rec.on_event)
    bus.subscribe(live.on_event)
    rec.start()
    run = SyntheticRun(rec.start_ns, num_requests=80, num_pages=40, seed=5)
    for event in run.events:
        bus.emit(event)
    final = rec.finish()
    assert run.truth.preemptions > 0 and run.truth.evicted_pages > 0
    # Re-lookups of recompute-preempted requests are left out of the hit rate, live and
    # stored alike (vLLM's rule): the run has some, and both count first lookups only.
    relookups = [e for e in run.events if isinstance(e, PrefixLookup) and e.preempted]
    assert relookups
    assert final.prefix_queried_tokens == run.truth.prefix_queried_tokens
    assert final.prefix_hit_tokens == run.truth.prefix_hit_tokens
    assert dataclasses.replace(live.summary("complete"), run_id=rec.run_id) == final
    assert final == queries.run_summary(path, rec.run_id)
    assert live.kernel_stats() == queries.kernel_stats(path, rec.run_id)
    assert live.kernel_stats()[0].peak_tflops_frac == pytest.approx(0.2)  # 0.02 of 0.1
    assert live.kernel_stats()[0].peak_gbps_frac == pytest.approx(0.25)  # 1 of 4
    steps = [e for e in run.events if isinstance(e, StepSummary)]
    assert live.inter_token_latency.count == sum(e.decode_tokens for e in steps)
    assert live.ttft.count == run.truth.requests
    last = steps[-1]
    assert live.page_usage() == last.pages_used / last.pages_total


def test_window_rates_are_counter_differences_over_the_window() -> None:
    live = LiveMetrics(start_ns=0)
    assert live.window() is None
    live.on_event(_step(0, 1.0))
    live.on_event(PrefixLookup(int(1.5e9), 1, 7, queried_tokens=100, hit_tokens=30))
    live.on_event(PageEvicted(int(1.5e9), 1, 3, "dropped", "lru"))
    live.on_event(_step(1, 2.0))
    live.on_event(PageEvicted(int(2.5e9), 2, 4, "dropped", "lru"))
    live.on_event(_step(2, 3.0, decode=8))
    whole = live.window(10.0)
    assert whole.seconds == pytest.approx(2.0)
    assert whole.decode_tokens_per_s == pytest.approx((4 + 8) / 2.0)
    assert whole.evictions_per_s == pytest.approx(1.0)
    assert whole.hit_rate == pytest.approx(0.3)
    last = live.window(1.0)
    assert last.seconds == pytest.approx(1.0)
    assert last.decode_tokens_per_s == pytest.approx(8.0)
    assert last.evictions_per_s == pytest.approx(1.0)
    assert last.hit_rate is None  # no lookups in the last second
    assert last.preemptions_per_s == 0.0


def test_gauges_inter_token_latency_and_ttft() -> None:
    live = LiveMetrics(start_ns=0)
    assert live.page_usage() is None and live.token_usage() is None
    live.on_event(_step(0, 1.0, decode=2))  # first step: its own duration, 0.05 s
    live.on_event(_step(1, 1.3, decode=3, used=12, held=180))  # 0.3 s after the previous
    assert live.page_usage() == pytest.approx(12 / 40)
    assert live.token_usage() == pytest.approx(180 / (12 * 16))
    assert live.fragmentation_slots() == 12 * 16 - 180
    assert live.inter_token_latency.count == 5
    assert live.inter_token_latency.sum == pytest.approx(2 * 0.05 + 3 * 0.3)
    live.on_event(FirstToken(0, 0, 1, 0.2))
    assert live.ttft.cumulative()[7] == (0.1, 0) and live.ttft.cumulative()[8] == (0.25, 1)
    assert live.summary().elapsed_s == pytest.approx(1.3)


def test_histogram_bounds_are_inclusive() -> None:
    hist = Histogram((0.1, 1.0))
    for value in (0.1, 0.5, 1.0, 3.0):
        hist.observe(value)
    hist.observe(0.05, times=2)
    assert hist.cumulative() == [(0.1, 3), (1.0, 5), (float("inf"), 6)]
    assert hist.count == 6 and hist.sum == pytest.approx(4.7)
