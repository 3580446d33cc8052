"""The page map tells the truth at every step: what db/ rebuilds from a recording
equals the engine's own page state (tests/page_probe.py), page by page, state by
state, holder count by holder count, with the invariants of db/page_states.py.

Real runs of the tiny model cover the shared-prefix workload, preemption with
recompute and with swap, offload and reload, InfLLM and a 100,000-page pool; one
short real-model run (slow) covers the shared-prefix workload on SmolLM2.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvscope.db.page_replay import step_pages
from kvscope.db.page_states import STATE_CACHED, STATE_SHARED
from kvscope.engine.engine import Engine
from kvscope.engine.tiny import VOCAB, tiny_engine, tiny_loaded
from kvscope.profiler.recorder import Recorder

from support.infllm_recording import infllm_config
from support.page_probe import PageProbe, mismatches, record_probed, shared_prefix_arrivals


def _assert_truth(path: Path, run_id: int, probe: PageProbe) -> None:
    assert len(probe.truth) > 10
    wrong = mismatches(path, run_id, probe)
    assert not wrong, f"{len(wrong)} differences, first: {wrong[:5]}"


def _shared_steps(probe: PageProbe) -> int:
    return sum(1 for t in probe.truth.values() if np.any(t.state == STATE_SHARED))


def test_shared_prefix(tmp_path):
    run_id, probe, _ = record_probed(
        tmp_path / "r.db", lambda bus: tiny_engine(64, bus=bus), shared_prefix_arrivals(10)
    )
    assert _shared_steps(probe) > 5
    assert max(int(t.holders.max()) for t in probe.truth.values()) >= 3
    _assert_truth(tmp_path / "r.db", run_id, probe)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption(tmp_path, mode):
    run_id, probe, kinds = record_probed(
        tmp_path / "r.db",
        lambda bus: tiny_engine(22, bus=bus, preemption=mode),
        shared_prefix_arrivals(8, prefix_len=16, every=0, out=24),
    )
    assert kinds.get("request_preempted", 0) > 0
    _assert_truth(tmp_path / "r.db", run_id, probe)


def test_offload_and_reload(tmp_path):
    rng = random.Random(1)
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(16)] for _ in range(3)]
    arrivals = [(6 * i, prefixes[i % 3] + [rng.randrange(1, VOCAB)], 6) for i in range(12)]
    run_id, probe, kinds = record_probed(
        tmp_path / "r.db",
        lambda bus: tiny_engine(14, bus=bus, offload="always", max_batched_tokens=7),
        arrivals,
    )
    assert kinds.get("page_offloaded", 0) > 0 and kinds.get("page_reloaded", 0) > 0
    assert any(np.any(t.state == STATE_CACHED) for t in probe.truth.values())
    _assert_truth(tmp_path / "r.db", run_id, probe)


def test_infllm(tmp_path):
    config = infllm_config()
    loaded = tiny_loaded(max_position=1024)
    rng = random.Random(2)
    arrivals = [(0, [rng.randrange(1, VOCAB) for _ in range(n)], 10) for n in (200, 120)]
    run_id, probe, kinds = record_probed(
        tmp_path / "r.db", lambda bus: Engine(config, bus=bus, loaded=loaded), arrivals
    )
    assert kinds.get("infllm_retrieval", 0) > 0
    # InfLLM's host blocks read "offloaded" at the step they left (not "free"), in the
    # engine and in the recording alike, and the run counts one offload per page (a page
    # offloaded and handed out again in one step reads held, so >=).
    shown = sum(t.counts().offloaded for t in probe.truth.values())
    assert shown > 0 and kinds.get("page_offloaded", 0) >= shown
    _assert_truth(tmp_path / "r.db", run_id, probe)


def test_a_100k_page_pool(tmp_path, capsys):
    run_id, probe, _ = record_probed(
        tmp_path / "r.db",
        lambda bus: tiny_engine(100_000, bus=bus),
        shared_prefix_arrivals(12, prefix_len=40, out=6),
    )
    assert _shared_steps(probe) > 3
    _assert_truth(tmp_path / "r.db", run_id, probe)
    # Cost per step at 100k pages (figures in the test output; bench/page_states.py
    # measures it against a run length).
    steps = sorted(probe.truth)
    t0 = time.perf_counter()
    for step in steps:
        step_pages(tmp_path / "r.db", run_id, step)
    per_step_ms = (time.perf_counter() - t0) / len(steps) * 1e3
    with capsys.disabled():
        print(f"\n100k-page pool: step_pages {per_step_ms:.1f} ms/step over {len(steps)} steps")


@pytest.mark.slow
def test_real_model_shared_prefix(make_engine, tmp_path):
    from kvscope.app.run_job import drive
    from kvscope.app.workloads import builtin

    engine = make_engine(kv_budget_bytes=128 << 20, page_map_every=4)
    path = tmp_path / "r.db"
    recorder = Recorder(path, {"test": True}, model="smollm2")
    engine.bus.subscribe(recorder.on_event)
    recorder.start()
    probe = PageProbe(engine)
    step = engine.step

    def probed_step():
        out = step()
        probe.read()
        return out

    engine.step = probed_step
    # Later arrivals find the first one's document in the prefix tree and share it.
    items = [
        replace(item, max_tokens=12, arrival_s=0.0 if i == 0 else 0.01)
        for i, item in enumerate(builtin("shared-prefix", 4, rate=0.0))
    ]
    counts = drive(engine, items, threading.Event())
    recorder.finish("complete")
    assert _shared_steps(probe) > 0, counts
    _assert_truth(path, recorder.run_id, probe)
