"""The fused decode-path kernels compile for sm_90 (H100/H200) without a GPU, without spills.

The interpreter accepts code the GPU compiler rejects; ``support/sm90_compile.py``'s
stand-in driver lets the JIT compile real cubins on the CPU. ``support/fused_compile.py``
is the script the test runs (``TRITON_INTERPRET`` must be unset there): add+RMSNorm
with and without the residual, SiLU*mul at Llama-3-8B widths, and the RoPE + KV
write in every KV format at head_dim 128.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.fused_compile import KV_FORMATS

TESTS = Path(__file__).resolve().parents[1]


def test_fused_kernels_compile_for_sm90_without_spills() -> None:
    import triton.backends.nvidia

    if not (Path(triton.backends.nvidia.__file__).parent / "bin" / "cuobjdump").exists():
        pytest.skip("this triton build ships no cuobjdump")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "support.fused_compile"],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = [json.loads(line) for line in done.stdout.splitlines()]
    assert {k["variant"] for k in kernels} == {"add", "norm", "silu", *KV_FORMATS}
    spilled = [k for k in kernels if k["local_bytes"]]
    assert not spilled, spilled
