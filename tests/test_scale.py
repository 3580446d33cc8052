"""The prefix cache and step summaries at GPU scale, on the CPU: a 100,000-page pool.

An 8B-shape run on one H200 has about 55,000 pages. Here the tiny model gets
a 100,000-page pool (4-token pages, so the KV storage is 51 MB), the prefix
cache is filled to the brim with cached chains, and a workload with a shared
prompt stem then runs through the real engine, evicting as it goes. The
cache's own work counters (tree nodes visited, heap operations) show that no
step does work that grows with the pool or the tree: each step's counts equal
those of the same run on a 1,000-page pool filled the same way, while the old
whole-tree walk would visit 100,000 nodes per eviction. Two counters sit
outside the cache, so a walk added later cannot hide from them: reads of the
pool's reference counts and calls of the eviction policy. The recorder bounds
its queue of 100,000-page maps by bytes and stores them compressed.
"""

from __future__ import annotations

import sqlite3
import zlib

import numpy as np
import pytest

from kvscope.engine.events import (
    PAGE_CACHED,
    PAGE_EVICTED,
    PAGE_FREE,
    EventBus,
    PageMap,
    StepSummary,
)
from kvscope.engine.eviction import LRU
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import fill_cache, shared_stem_workload, tiny_engine
from kvscope.profiler.recorder import Recorder

from support.engine_runs import run_all

PAGE = 4
SLACK = 40  # free pages fill_cache leaves, so the workload must evict


class CountingRefcounts(list):
    """The pool's reference counts, counting reads."""

    reads = 0

    def __getitem__(self, i):
        self.reads += 1
        return super().__getitem__(i)


class CountingLRU(LRU):
    calls = 0

    def priority(self, node):
        self.calls += 1
        return super().priority(node)


def counted_engine(pages: int, **kw):
    engine = tiny_engine(pages, PAGE, max_batched_tokens=64, **kw)
    engine.kv.pool.refcount = CountingRefcounts(engine.kv.pool.refcount)
    engine.kv.prefix.policy = CountingLRU()
    return engine


def work_done(engine) -> int:
    cache = engine.kv.prefix
    return cache.work.nodes + cache.work.heap + cache.policy.calls + engine.kv.pool.refcount.reads


def run_counted(engine, arrivals, check_every: int = 0):
    """Like ``run_all``, recording the cache's work per step; returns (outputs, work per step)."""
    pending = sorted(enumerate(arrivals), key=lambda a: a[1][0])
    outputs: dict[int, list[int]] = {}
    index: dict[int, int] = {}
    per_step: list[int] = []
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][0] <= step:
            position, (_, prompt, n) = pending.pop(0)
            rid = engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
            index[rid] = position
        before = work_done(engine)
        for out in engine.step():
            if out.finished:
                outputs[index[out.request_id]] = out.token_ids
        per_step.append(work_done(engine) - before)
        if check_every and step % check_every == 0:
            engine.kv.check_integrity()
        step += 1
        assert step < 2000, "engine made no progress"
    return outputs, per_step


# Evicted pages dropped, or offloaded to a host tier of 64 slots that fills up (then
# dropping a page releases the host slots of its offloaded descendants).
MODES = {"drop": {}, "offload": {"offload": "always", "host_budget_bytes": 64 * PAGE * 128}}


@pytest.fixture(scope="module", params=sorted(MODES))
def big_run(request):
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    engine = counted_engine(100_000, bus=bus, **MODES[request.param])
    assert engine.num_pages == 100_000
    filled = fill_cache(engine)
    engine.kv.check_integrity()
    outputs, per_step = run_counted(engine, shared_stem_workload(), check_every=25)
    engine.kv.check_integrity()
    return engine, filled, outputs, per_step, events, request.param


def test_outputs_match_small_pools_and_no_cache(big_run):
    _, _, outputs, _, _, _ = big_run
    work = shared_stem_workload()
    assert outputs == run_all(tiny_engine(64, PAGE, max_batched_tokens=64), work)
    assert outputs == run_all(tiny_engine(400, PAGE, prefix_cache=False), work)


def test_evicts_through_a_full_tree_and_keeps_every_invariant(big_run):
    engine, filled, _, _, events, mode = big_run
    if mode == "offload":
        assert engine.kv.host.num_free == 0  # the host tier filled, then pages were dropped
        assert any(e.kind == "page_offloaded" for e in events)
    assert filled == 100_000 - SLACK
    evicted = sum(e.kind == "page_evicted" for e in events)
    assert evicted > SLACK  # the workload ran on pages it had to take from the cache
    hits = [e for e in events if e.kind == "prefix_lookup"]
    assert sum(e.hit_tokens for e in hits) >= 20 * 24  # the shared stem was served from cache
    assert not engine.kv.holders
    assert engine.kv.pool.num_used == engine.kv.prefix.device_pages


def test_per_step_work_does_not_grow_with_the_pool(big_run):
    _, _, _, per_step, _, mode = big_run
    small = counted_engine(1_000, **MODES[mode])
    fill_cache(small)
    _, small_per_step = run_counted(small, shared_stem_workload())
    # The same steps do the same cache work on 1,000 and 100,000 pages.
    assert len(per_step) == len(small_per_step)
    assert max(per_step) <= max(small_per_step) + 8
    assert sum(per_step) <= sum(small_per_step) * 1.05 + 16
    assert max(per_step) < 1_000  # a tree walk would visit 100,000 nodes


def test_page_maps_and_step_summaries_agree_at_scale(big_run):
    engine, _, _, _, events, _ = big_run
    maps = [e for e in events if isinstance(e, PageMap)]
    steps = {e.step: e for e in events if isinstance(e, StepSummary)}
    assert len(maps) >= 5
    for snapshot in maps:
        owners = snapshot.owners
        summary = steps[snapshot.step]
        assert len(owners) == 100_000
        assert np.count_nonzero(owners == PAGE_CACHED) == summary.pages_cached
        assert np.count_nonzero(owners >= 0) == summary.pages_used - summary.pages_cached
        assert np.count_nonzero((owners == PAGE_FREE) | (owners == PAGE_EVICTED)) == (
            summary.pages_free
        )
    assert any(np.count_nonzero(m.owners == PAGE_EVICTED) for m in maps)


def test_recorder_bounds_queued_page_maps_by_bytes_and_stores_them_compressed(tmp_path):
    maps = [np.full(100_000, PAGE_FREE, dtype=np.int32) for _ in range(5)]
    for i, owners in enumerate(maps):
        owners[: 20_000 * i] = np.arange(20_000 * i) // 64  # requests of 64 pages
        owners[20_000 * i : 20_000 * i + 5_000] = PAGE_CACHED
    path = tmp_path / "scale.db"
    rec = Recorder(path, {}, "tiny", hardware={}, versions={}, max_queue_bytes=3 * 400_000)
    for step, owners in enumerate(maps):  # no writer thread yet: everything stays queued
        rec.on_event(PageMap(step, step, owners))
    assert rec.queued == 3 and rec.dropped_events == 2  # the byte budget holds three maps
    assert rec.flush() == 3
    rec.on_event(PageMap(9, 9, maps[4]))  # the flush gave the budget back
    assert rec.queued == 1
    rec.finish()
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT step, pages_cached, owners FROM page_maps ORDER BY step"
        ).fetchall()
    assert [r[0] for r in rows] == [0, 1, 2, 9]
    for (_, cached, blob), owners in zip(rows, [*maps[:3], maps[4]], strict=True):
        stored = np.frombuffer(zlib.decompress(blob), dtype="<i4")
        assert np.array_equal(stored, owners) and cached == 5_000
        assert len(blob) < owners.nbytes / 20
