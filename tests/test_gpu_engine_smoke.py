"""bench/gpu_engine.py --smoke: every part of the GPU script runs on the CPU with tiny shapes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_engine_smoke_writes_its_figures_and_a_recorded_run(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_engine.py"), str(tmp_path), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads((tmp_path / "gpu_engine.json").read_text())
    for model in ("small-llama", "small-qwen2"):
        part = figures["correctness"][model]
        assert part["exact"] == part["prompts"] == 8
        assert part["preempted"] > 0 and part["chunks"] > 0 and part["prefix_hit_tokens"] > 0
        assert 0.8 < part["bf16_top1"] <= 1.0
        assert 0.9 < part["score_by_token_top1"] <= 1.0
    batches = figures["throughput"]["batches"]
    assert set(batches) == {"1", "4", "8"}
    assert all(b["tok_s"] > 0 and b["transformers_tok_s"] > 0 for b in batches.values())
    assert all(b["transformers_static_compile_tok_s"] > 0 for b in batches.values())
    assert "| throughput   | transformers static+compile tok/s, batch 1" in proc.stdout
    # A ratio of two timings on a busy CPU: only that it was measured, not its size.
    assert batches["4"]["recording_on_over_off"] > 0
    budget = figures["throughput"]["memory_budget"]
    assert budget["weights_bytes"] > 0 and budget["overhead_bytes"] > 0
    run = figures["recorded_run"]
    assert run["ok"] and run["finished"] == 24 and run["db_bytes"] <= 16 << 20
    with sqlite3.connect(tmp_path / "gpu_engine.db") as db:
        kinds = {k for (k,) in db.execute("select distinct kind from events")}
        assert "memory_budget" in kinds
    assert "| correctness  | small-llama fp32 greedy = transformers" in proc.stdout
