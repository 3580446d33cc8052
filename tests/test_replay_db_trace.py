"""``app.replay_db.trace_from_run``: a recorded run with preemptions (recompute and swap)
becomes a trace whose hash ids are its requests' real prompt blocks.

The recording is a roofline replay of the Mooncake slice under overload: the engine's
own scheduler, KV manager and radix cache emit the page events, and the trace it
replayed gives each request's true hash ids to compare with."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.cli import main
from app.replay_db import trace_from_run
from engine.replay import ReplayConfig, ReplayDriver, read_replay_trace
from engine.replay.traces import ReplayTrace

SLICE = Path(__file__).parent / "data" / "mooncake_conversation_head400.jsonl"
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
            "UPDATE events SET payload = json_remove(payload, '$.hashes', '$.parents') "
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
