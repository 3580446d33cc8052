"""``app.replay_db.trace_from_run``: a recorded run with preemptions (recompute and swap)
becomes a trace whose hash ids are its requests' real prompt blocks.

The recordings: a roofline replay of the Mooncake slice under overload (the engine's
own scheduler, KV manager and radix cache emit the page events; the trace it replayed
gives each request's true hash ids), and live tiny-model engine runs whose prompts give
the true pages."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kvscope.app.cli import main
from kvscope.app.replay_db import trace_from_run
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import EventBus
from kvscope.engine.replay import ReplayConfig, ReplayDriver, read_replay_trace
from kvscope.engine.replay.traces import ReplayTrace
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import tiny_loaded
from kvscope.profiler.recorder import Recorder

from support.mooncake_slice import SLICE

LIMIT = 250


@pytest.mark.parametrize(
    "preemption", [("recompute",), ("swap", "--host-budget", "40GiB")], ids=lambda p: p[0]
)
def test_a_preempted_runs_trace_holds_its_requests_real_blocks(capsys, tmp_path, preemption):
    db = tmp_path / "r.db"
    code = main(
        [
            "replay", str(SLICE), "--timing", "roofline", "--capacity", "2e6",
            "--eviction-policy", "lru", "--limit", str(LIMIT), "--json", "--workers", "1",
            "--preemption", *preemption, "--db", str(db),
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    [point] = [p for p in json.loads(out)["points"] if p["capacity_tokens"] == 2_000_000]
    assert point["preemptions"] > 0 and point["rejected"] == 0  # what this test is about

    original = read_replay_trace(SLICE).head(LIMIT)
    derived = trace_from_run(db, point["run_id"])
    truth = same_blocks(original, derived)
    # chain hashes name content exactly: one derived id per real block, and back
    assert len(set(truth.values())) == len(truth)
    # so the derived trace shares what the real one does: the same ceiling, above the run
    again = ReplayDriver(derived, ReplayConfig(page_size=512)).run()
    ceiling = ReplayDriver(original, ReplayConfig(page_size=512)).run()
    assert point["hit_tokens"] < again.hit_tokens == ceiling.hit_tokens

    # A recording from before BlockStored carried hashes: content by page and store
    # count. Still one id per full prompt page and never a false share.
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "UPDATE events SET payload = json_remove(payload, '$.hashes', '$.copies', '$.copy_hashes') "
            "WHERE kind = 'block_stored'"
        )
    conn.close()
    same_blocks(original, trace_from_run(db, point["run_id"]))


def same_blocks(original: ReplayTrace, derived: ReplayTrace) -> dict[int, int]:
    """Check the derived trace holds one id per full prompt page, each standing for one
    real block; returns derived id -> real hash id."""
    assert len(derived.entries) == len(original.entries) and derived.block_size == 512
    truth: dict[int, int] = {}
    for real, got in zip(original.entries, derived.entries, strict=True):
        assert got.input_len == real.input_len
        full = real.input_len // 512
        assert len(got.blocks) == full  # one id per full prompt page, re-allocations or not
        for d, r in zip(got.blocks, real.blocks[:full], strict=True):
            # one derived id never stands for two different blocks (that would be a false hit)
            assert truth.setdefault(d, r) == r, "a derived id names two different blocks"
    return truth


def record_tiny_run(db: Path, prompts: list[list[int]], kv_budget: int, max_tokens: int) -> int:
    """Run ``prompts`` (all added at once) through the engine with the tiny model, page size
    4, recorded to ``db``; returns the run's id."""
    bus = EventBus()
    engine = Engine(
        EngineConfig(page_size=4, kv_budget_bytes=kv_budget), bus=bus, loaded=tiny_loaded()
    )
    recorder = Recorder(db, {"page_size": 4, "test": "trace"}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    recorder.finish("complete")
    return recorder.run_id


def test_a_live_engine_runs_trace_names_its_token_pages(tmp_path):
    """The engine itself (tiny model), preempting under a small KV budget: equal derived
    ids exactly where two prompts share a whole prefix of full pages."""
    shared = list(range(1, 13))  # three full pages every prompt starts with
    prompts = [shared + [20 + 3 * i + j for j in range(3 + i % 3 * 4)] for i in range(8)]
    db = tmp_path / "live.db"
    run_id = record_tiny_run(db, prompts, kv_budget=24 * 1024, max_tokens=12)
    conn = sqlite3.connect(db)
    preempted = conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'request_preempted'")
    assert preempted.fetchone()[0] > 0  # what this test is about

    derived = trace_from_run(db, run_id)
    assert [e.input_len for e in derived.entries] == [len(p) for p in prompts]
    named: dict[tuple[int, ...], int] = {}  # a whole prefix of full pages -> its derived id
    for prompt, entry in zip(prompts, derived.entries, strict=True):
        assert len(entry.blocks) == len(prompt) // 4
        for k, d in enumerate(entry.blocks):
            assert named.setdefault(tuple(prompt[: (k + 1) * 4]), d) == d
    assert len(set(named.values())) == len(named)  # and different prefixes, different ids


def test_identical_prompts_computed_together_get_one_id_per_page(tmp_path):
    """Four equal prompts admitted in one step each compute every page; the cache keeps the
    first copy, and the other three requests' copies still name that content."""
    prompt = list(range(1, 19))  # four full pages and two tokens
    db = tmp_path / "same.db"
    run_id = record_tiny_run(db, [prompt] * 4, kv_budget=1 << 20, max_tokens=3)
    entries = trace_from_run(db, run_id).entries
    assert len(entries) == 4 and len(entries[0].blocks) == 4
    assert all(e.blocks == entries[0].blocks for e in entries), [e.blocks for e in entries]
    assert len(set(entries[0].blocks)) == 4
