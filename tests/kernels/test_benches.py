"""The benchmark scripts run, or refuse in one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_gpu_benchmark_refuses_without_cuda() -> None:
    done = run_script("bench/gpu_kernels.py")
    assert done.returncode == 1
    assert done.stderr.strip().startswith("gpu_kernels: no CUDA device")
    assert len(done.stderr.strip().splitlines()) == 1


def test_gpu_benchmark_checks_and_times_in_smoke_mode() -> None:
    done = run_script("bench/gpu_kernels.py", "--smoke")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("prefill", "decode"))]
    kinds = [line[:27].strip() for line in rows]
    # two equal-length prefill shapes (varlen + paged each), one ragged batch, five decode rows
    assert (
        kinds
        == ["prefill varlen", "prefill paged, half cached"] * 2
        + ["prefill ragged vs SDPA/seq"]
        + ["decode paged"] * 5
    )
    assert all(line.endswith("info") for line in rows)  # the interpreter's speed has no goal
    assert "D=80 bf16" in rows[2] and "D=96 bf16" in rows[-1]
    # fp8, int8 and int4 decode each set against fp16 on the same shape
    ratios = lines[lines.index(next(x for x in lines if x.startswith("quantized decode"))) + 2 :]
    formats = [line.split()[4] for line in ratios if line.startswith("B=2 ctx=128")]
    assert formats == ["fp8_e4m3", "int8", "int4"]
    assert all(line.endswith("info") for line in ratios if line.startswith("B="))
