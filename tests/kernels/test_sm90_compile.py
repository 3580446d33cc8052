"""Every kernel config fits an sm_90 (H100/H200) device, checked without a GPU.

The interpreter accepts code the GPU compiler rejects (it caught a return
type mismatch between constexpr branches here) and says nothing about
registers or shared memory, so every config the autotuner may time on an
sm_90 device, at every head-dim class, is also compiled for a real target,
on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton.backends.nvidia

from kvscope.kernels.launch_configs import SM90_SHARED_BYTES

from support.sm90_compile import VARIANTS

TESTS = Path(__file__).resolve().parents[1]
PARTS = 2  # compiles are single-threaded: one process per core CI has


def test_every_config_fits_sm90_shared_memory_without_spills() -> None:
    if not (Path(triton.backends.nvidia.__file__).parent / "bin" / "cuobjdump").exists():
        pytest.skip("this triton build ships no cuobjdump")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    parts = [
        subprocess.Popen(
            [sys.executable, "-m", "support.sm90_compile", str(part), str(PARTS)],
            cwd=TESTS,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for part in range(PARTS)
    ]
    kernels = []
    for proc in parts:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        kernels += [json.loads(line) for line in out.splitlines()]
    tuned = [k for k in kernels if k["estimate"] is not None]

    expected = {
        f"{kind} q={q} kv={kv} H={hq}/{hkv} D={d}"
        for kind, q, kv, hq, hkv, dims in VARIANTS
        for d in dims
    }
    assert {k["variant"] for k in tuned} == expected
    # The merge kernel has one config; it compiles once per decode launch.
    merges = [k for k in kernels if k["kernel"] == "_decode_merge_kernel"]
    assert len(merges) == sum(len(v[5]) for v in VARIANTS if v[0] == "decode")
    # Several configs left to tune between at every variant but fp32 at head_dim 256.
    for variant in expected:
        count = sum(k["variant"] == variant for k in tuned)
        assert count >= (1 if "D=200" in variant and "q=fp32" in variant else 3), variant

    too_big = [
        (k["variant"], k["config"], k["shared_bytes"])
        for k in tuned
        if k["shared_bytes"] > SM90_SHARED_BYTES
    ]
    assert not too_big, f"configs over 227 KiB of shared memory: {too_big}"
    # The pruning's estimate never falls short of what the compiler allocates.
    under = [(k["variant"], k["config"]) for k in tuned if k["shared_bytes"] > k["estimate"]]
    assert not under, f"shared memory estimated too low for {under}"

    full = [k for k in kernels if "registers" in k]
    assert len(full) == len(expected) + len(merges)  # one cubin per launch, plus the merges
    spilled = [k["variant"] for k in full if k["local_bytes"]]
    assert not spilled, f"register spills in {spilled}"
    assert all(0 < k["registers"] <= 255 for k in full)
