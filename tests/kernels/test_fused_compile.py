"""The fused decode-path kernels compile for sm_90 (H100/H200) without a GPU, without spills.

The interpreter accepts code the GPU compiler rejects; ``sm90_compile.py``'s
stand-in driver lets the JIT compile real cubins on the CPU. This file is also
the script the test runs (``TRITON_INTERPRET`` must be unset there): add+RMSNorm
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

KV_FORMATS = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from sm90_compile import Sm90Driver, resources
    from triton.runtime import driver

    driver.set_active(Sm90Driver())
    from kernels import triton_rmsnorm, triton_rope_kv, triton_silu
    from kernels.kv_quant import KVPages

    class CompileOnly:
        def __init__(self, kernel, label: list[str]) -> None:
            self.kernel, self.label = kernel, label

        def __getitem__(self, grid):  # noqa: ANN001, ANN204
            def launch(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
                compiled = self.kernel.warmup(*args, grid=grid, **kwargs)
                print(json.dumps({"kernel": self.kernel.__name__, "variant": self.label[0],
                                  **resources(compiled.asm["cubin"])}), flush=True)  # fmt: skip

            return launch

    label = [""]
    triton_rmsnorm._add_rms_norm_kernel = CompileOnly(triton_rmsnorm._add_rms_norm_kernel, label)
    triton_silu._silu_mul_kernel = CompileOnly(triton_silu._silu_mul_kernel, label)
    triton_rope_kv._rope_kv_kernel = CompileOnly(triton_rope_kv._rope_kv_kernel, label)
    bf16 = torch.bfloat16
    r = torch.zeros(2, 4096, dtype=bf16)
    label[0] = "add"
    triton_rmsnorm.add_rms_norm_triton(r, r.clone(), torch.ones(4096, dtype=bf16), 1e-5)
    label[0] = "norm"
    triton_rmsnorm.add_rms_norm_triton(None, r, torch.ones(4096, dtype=bf16), 1e-5)
    label[0] = "silu"
    triton_silu.silu_mul_triton(torch.zeros(2, 2 * 14336, dtype=bf16))
    for kv in KV_FORMATS:
        label[0] = kv
        pages = KVPages.allocate(4, 16, 8, 128, kv)
        q_dtype = {"fp32": torch.float32, "fp16": torch.float16}.get(kv, bf16)
        triton_rope_kv.rope_kv_write_triton(
            torch.zeros(2, 48 * 128, dtype=bf16), torch.zeros(2, dtype=torch.long),
            torch.zeros(64, 128), torch.zeros(64, 128), torch.zeros(2, dtype=torch.long),
            pages, 32, 8, 128, q_dtype,
        )  # fmt: skip


def test_fused_kernels_compile_for_sm90_without_spills() -> None:
    import triton.backends.nvidia

    if not (Path(triton.backends.nvidia.__file__).parent / "bin" / "cuobjdump").exists():
        pytest.skip("this triton build ships no cuobjdump")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = [json.loads(line) for line in done.stdout.splitlines()]
    assert {k["variant"] for k in kernels} == {"add", "norm", "silu", *KV_FORMATS}
    spilled = [k for k in kernels if k["local_bytes"]]
    assert not spilled, spilled


if __name__ == "__main__":
    main()
