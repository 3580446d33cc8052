"""The read API on a recorded synthetic run: every figure equals what the run counted."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from kvscope.db import queries
from kvscope.db.schema import COMPLETE, INCOMPLETE, RUNNING
from kvscope.db.series import busiest_step
from kvscope.db.source import run_origin
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import PAGE_FREE, PageMap, PagesAllocated, PagesFreed, StepSummary
from kvscope.profiler.recorder import Recorder
from kvscope.profiler.synthetic import SyntheticRun, record_synthetic


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, SyntheticRun]:
    path = tmp_path_factory.mktemp("q") / "k.db"
    run_id, run = record_synthetic(path, num_requests=120, num_pages=48, gpu=True, seed=3)
    return path, run_id, run


def test_run_summary_equals_the_runs_own_counters(recorded) -> None:
    path, run_id, run = recorded
    s = queries.run_summary(path, run_id)
    truth = run.truth
    assert s.status == COMPLETE
    assert s.requests == truth.requests == 120
    assert s.requests_finished == truth.requests_finished == 120
    assert s.output_tokens == truth.output_tokens
    assert s.prefix_queried_tokens == truth.prefix_queried_tokens
    assert s.prefix_hit_tokens == truth.prefix_hit_tokens > 0
    assert s.prefix_hit_rate == pytest.approx(truth.prefix_hit_tokens / truth.prefix_queried_tokens)
    assert s.evicted_pages == truth.evicted_pages > 0
    assert s.offloaded_pages == truth.offloaded_pages > 0
    assert s.reloaded_pages == truth.reloaded_pages
    assert s.preemptions == truth.preemptions
    assert s.steps == truth.steps
    assert s.dropped_events == 0
    steps = [e for e in run.events if isinstance(e, StepSummary)]
    elapsed = (steps[-1].ts_ns - run_origin(_conn(path), run_id)) / 1e9
    assert s.elapsed_s == pytest.approx(elapsed)
    assert s.tokens_per_s == pytest.approx(truth.output_tokens / elapsed)
    assert s.peak_page_usage == pytest.approx(max(e.pages_used / e.pages_total for e in steps))
    held = sum(e.tokens_held for e in steps)
    slots = sum(e.pages_used * e.page_size for e in steps)
    assert s.mean_token_usage == pytest.approx(held / slots)
    ttfts = [r.ttft_s for r in queries.requests_table(path, run_id)]
    assert s.ttft_p50_s == pytest.approx(float(np.percentile(ttfts, 50)))
    assert s.ttft_p99_s == pytest.approx(float(np.percentile(ttfts, 99)))


def _conn(path: Path):
    from kvscope.db.store import open_db

    return open_db(path, create=False).conn


def test_pages_allocated_minus_freed_equal_pages_in_use_at_every_snapshot(recorded) -> None:
    path, run_id, run = recorded
    balances = queries.page_accounting(path, run_id)
    assert [b.step for b in balances] == list(run.truth.pages_in_use_at_snapshot)
    for b in balances:
        # The synthetic engine shares no pages: references and pages are one.
        assert b.allocated - b.freed == b.referenced == b.owned
        assert b.owned == run.truth.pages_in_use_at_snapshot[b.step]
    assert balances[-1].allocated > balances[-1].owned  # pages were freed and reused
    snap = queries.page_map_at(path, run_id, balances[3].step)
    assert int(np.count_nonzero(snap.owners >= 0)) == balances[3].owned


def test_page_accounting_counts_shared_prefix_pages_once(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    rec = Recorder(path, {}, "m", hardware={}, versions={})
    t = rec.start_ns
    owners = np.full(6, PAGE_FREE, dtype=np.int32)
    events = [
        PagesAllocated(t + 1, 0, 1, (0, 1, 2)),
        PagesAllocated(t + 2, 0, 2, (0, 1)),  # prefix hit: shares pages 0 and 1
        PagesAllocated(t + 3, 0, 2, (3,)),
    ]
    owners[[0, 1, 2, 3]] = [1, 1, 1, 2]
    events.append(PageMap(t + 4, 0, owners.copy()))
    events.append(PagesFreed(t + 5, 1, 1, (0, 1, 2)))  # request 1 done: 0, 1 still used by 2
    owners[[0, 1, 2]] = [2, 2, PAGE_FREE]
    events.append(PageMap(t + 6, 1, owners.copy()))
    events.append(PagesAllocated(t + 7, 1, 3, (4,)))  # after the snapshot: not counted in it
    for event in events:
        rec.on_event(event)
    rec.finish()
    balances = queries.page_accounting(path, rec.run_id)
    assert [(b.allocated, b.freed, b.referenced, b.owned) for b in balances] == [
        (6, 0, 4, 4),
        (6, 3, 3, 3),
    ]


def test_step_series_downsamples_and_keeps_totals(recorded) -> None:
    path, run_id, run = recorded
    steps = [e for e in run.events if isinstance(e, StepSummary)]
    full = queries.step_series(path, run_id, max_points=10_000)
    assert len(full) == len(steps)  # fine enough buckets: one step each
    assert [p.step for p in full] == [e.step for e in steps]
    points = queries.step_series(path, run_id, max_points=20)
    assert 0 < len(points) <= 20
    assert sum(p.steps for p in points) == len(steps)
    assert sum(p.prefix_hit_tokens for p in points) == run.truth.prefix_hit_tokens
    assert sum(p.prefix_queried_tokens for p in points) == run.truth.prefix_queried_tokens
    # Token rates are wall throughput: rate x the gaps of a bucket's steps gives
    # back its decode tokens, and these add up to the run's.
    gaps = [steps[0].duration_s] + [(b.ts_ns - a.ts_ns) / 1e9 for a, b in pairwise(steps)]
    decoded = sum(
        p.decode_tokens_per_s * sum(gaps[p.step - p.steps + 1 : p.step + 1]) for p in points
    )
    assert decoded == pytest.approx(sum(e.decode_tokens for e in steps))
    one, e = full[5], steps[5]
    assert one.page_usage == pytest.approx(e.pages_used / e.pages_total)
    assert one.token_usage == pytest.approx(e.tokens_held / (e.pages_used * e.page_size))
    assert one.fragmentation_slots == e.pages_used * e.page_size - e.tokens_held
    assert one.running == e.running and one.waiting == e.waiting
    assert one.decode_tokens_per_s == pytest.approx(e.decode_tokens / gaps[5])


def test_step_series_window(recorded) -> None:
    path, run_id, _ = recorded
    full = queries.step_series(path, run_id, max_points=10_000)
    lo, hi = full[10].t_s, full[30].t_s
    window = queries.step_series(path, run_id, max_points=10_000, since_s=lo, until_s=hi)
    assert [p.step for p in window] == [p.step for p in full[10:31]]
    # The first step of a window keeps its gap to the step before the window.
    assert window[0].decode_tokens_per_s == pytest.approx(full[10].decode_tokens_per_s)
    assert queries.step_series(path, run_id, since_s=1e6) == []


def test_page_map_at_is_the_nearest_snapshot_at_or_before(recorded) -> None:
    path, run_id, run = recorded
    maps = {e.step: e for e in run.events if isinstance(e, PageMap)}
    snap = queries.page_map_at(path, run_id, 12)
    assert snap is not None and snap.step == 10
    assert np.array_equal(snap.owners, maps[10].owners)
    assert snap.owners.dtype == np.int32
    assert snap.pages_owned + snap.pages_cached + snap.pages_free + snap.pages_evicted == 48
    assert queries.page_map_at(path, run_id, -1) is None


def test_page_maps_matrix_aggregates(recorded) -> None:
    path, run_id, run = recorded
    maps = [e for e in run.events if isinstance(e, PageMap)]
    matrix = queries.page_maps(path, run_id, max_snapshots=7, max_pages=10)
    assert len(matrix.steps) == 7 == matrix.owners.shape[1]
    assert matrix.steps[0] == maps[0].step and matrix.steps[-1] == maps[-1].step
    assert matrix.page_stride == 5 and matrix.owners.shape[0] == 10
    by_step = {e.step: e for e in maps}
    for j, step in enumerate(matrix.steps):
        pages = by_step[step].owners
        # Each row: the state most of its 5 pages are in (ties to requests, then
        # evicted, cached, free), a request's id when requests win.
        for i, row in enumerate(matrix.owners[:, j]):
            cell = pages[5 * i : 5 * i + 5]
            if row >= 0:
                assert row == cell.max() and np.count_nonzero(cell >= 0) >= max(
                    np.count_nonzero(cell == code) for code in (PAGE_FREE, -2, -3)
                )
            else:
                assert np.count_nonzero(cell == row) >= np.count_nonzero(cell >= 0)
    full = queries.page_maps(path, run_id, max_snapshots=10_000)
    assert full.owners.shape == (48, len(maps))


def test_requests_table(recorded) -> None:
    path, run_id, run = recorded
    rows = queries.requests_table(path, run_id)
    assert [r.request_id for r in rows] == list(range(120))
    assert all(r.status == "finished" for r in rows)
    assert sum(r.output_tokens for r in rows) == run.truth.output_tokens
    assert sum(r.preemptions for r in rows) == run.truth.preemptions
    for r in rows:
        assert r.queue_s >= 0 and r.e2e_s >= r.ttft_s > 0


def test_kernel_stats(recorded) -> None:
    path, run_id, run = recorded
    stats = {k.name: k for k in queries.kernel_stats(path, run_id)}
    assert {name: k.calls for name, k in stats.items()} == run.truth.kernel_calls
    # The synthetic kernels do 2e6 FLOP and 1e5 bytes per 1e-4 s: 0.02 TFLOP/s, 1 GB/s.
    for k in stats.values():
        assert k.tflops == pytest.approx(0.02)
        assert k.gbps == pytest.approx(1.0)
        assert k.peak_tflops_frac is None  # the run's hardware lists no peak
        assert k.mean_s == pytest.approx(k.total_s / k.calls)


def test_event_timeline(recorded) -> None:
    path, run_id, run = recorded
    everything = queries.event_timeline(path, run_id, limit=None)
    kinds = {e.kind for e in everything}
    assert kinds <= set(queries.TIMELINE_KINDS)
    expected = sum(1 for e in run.events if e.kind in queries.TIMELINE_KINDS)
    assert len(everything) == expected
    assert [e.t_s for e in everything] == sorted(e.t_s for e in everything)
    last = queries.event_timeline(path, run_id, limit=5)
    assert last == everything[-5:]
    evictions = queries.event_timeline(path, run_id, kinds=["page_evicted"], limit=None)
    assert len(evictions) == run.truth.evicted_pages
    assert set(evictions[0].payload) == {"page", "action", "policy"}


def test_gpu_series(recorded, tmp_path: Path) -> None:
    path, run_id, run = recorded
    points = queries.gpu_series(path, run_id, max_points=4)
    assert 0 < len(points) <= 4
    assert points[0].utilization_pct == 50.0 and points[0].gpu_index == 0
    no_gpu_id, _ = record_synthetic(tmp_path / "cpu.db", num_requests=3)
    assert queries.gpu_series(tmp_path / "cpu.db", no_gpu_id) == []


def test_list_runs_compare_and_latest_step(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    a, _ = record_synthetic(path, {"page_size": 16, "policy": "lru"}, num_requests=5, seed=1)
    b, _ = record_synthetic(path, {"page_size": 32, "policy": "lru"}, "interrupted", num_requests=5)
    runs = queries.list_runs(path)
    assert [r.run_id for r in runs] == [b, a]
    assert [r.status for r in runs] == ["interrupted", COMPLETE]
    assert runs[0].requests == 5 and runs[0].steps > 0 and runs[0].events_written > 0
    cmp = queries.compare_runs(path, [a, b])
    assert cmp.config_diff == {"page_size": [16, 32]}
    assert [s.run_id for s in cmp.summaries] == [a, b]
    progress = queries.latest_step(path, a)
    assert progress.step == runs[1].steps - 1 and progress.status == COMPLETE
    with pytest.raises(KvscopeError, match="no run 99"):
        queries.run_summary(path, 99)
    # The final figures are also stored for outside tools, equal to the read API's.
    conn = _conn(path)
    stored = dict(conn.execute("SELECT name, value FROM metrics WHERE run_id = ?", (a,)))
    summary = dataclasses.asdict(queries.run_summary(path, a))
    assert stored["prefix_hit_tokens"] == summary["prefix_hit_tokens"]
    assert stored["tokens_per_s"] == pytest.approx(summary["tokens_per_s"])


def test_resolve_status() -> None:
    now = time.time()
    host = socket.gethostname()
    alive = os.getpid()
    assert queries.resolve_status(COMPLETE, None, None, None) == COMPLETE
    assert queries.resolve_status(RUNNING, now - 1, alive, host, now) == RUNNING
    assert queries.resolve_status(RUNNING, now - 60, alive, host, now) == INCOMPLETE
    assert queries.resolve_status(RUNNING, None, alive, host, now) == INCOMPLETE
    gone = 2**22 + 12345  # above the default pid_max: no such process
    assert queries.resolve_status(RUNNING, now - 1, gone, host, now) == INCOMPLETE
    # Another host's process cannot be checked: only the heartbeat counts.
    assert queries.resolve_status(RUNNING, now - 1, gone, "elsewhere", now) == RUNNING


def test_empty_run_has_no_figures(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    run_id, _ = record_synthetic(path, num_requests=0)
    s = queries.run_summary(path, run_id)
    assert (s.requests, s.steps, s.tokens_per_s, s.ttft_p50_s, s.prefix_hit_rate) == (
        0,
        0,
        None,
        None,
        None,
    )
    assert queries.step_series(path, run_id) == []
    assert queries.page_map_at(path, run_id, 10) is None
    assert queries.page_maps(path, run_id).owners.shape == (0, 0)
    assert queries.latest_step(path, run_id).step is None
    assert PAGE_FREE == -1


def test_busiest_step_is_under_pressure_and_fullest(recorded) -> None:
    path, run_id, run = recorded
    steps = [e for e in run.events if isinstance(e, StepSummary)]
    pressure = min(e.step for e in run.events if e.kind in ("page_evicted", "request_preempted"))
    later = [e for e in steps if e.step >= pressure]
    best = max(later, key=lambda e: (e.running * e.pages_used, -e.step))
    assert busiest_step(path, run_id) == best.step


def test_an_unknown_event_kind_is_one_clear_error(recorded) -> None:
    path, run_id, _ = recorded
    with pytest.raises(KvscopeError, match="unknown event kind 'page_evict'"):
        queries.event_timeline(path, run_id, kinds=["page_evict"])
    with pytest.raises(KvscopeError, match="unknown event kind"):
        queries.event_counts(path, run_id, kinds=["nope"])
