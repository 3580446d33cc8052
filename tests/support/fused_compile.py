"""Compile the fused decode-path kernels for sm_90 on the CPU and print their resources.

Run by tests/kernels/test_fused_compile.py as ``python -m support.fused_compile``
(from tests/, with ``TRITON_INTERPRET`` unset): one JSON line per compiled kernel.
"""

from __future__ import annotations

import json

KV_FORMATS = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")


def main() -> None:
    import torch
    from triton.runtime import driver

    from support.sm90_compile import Sm90Driver, resources

    driver.set_active(Sm90Driver())
    from kvscope.kernels import triton_rmsnorm, triton_rope_kv, triton_silu
    from kvscope.kernels.kv_quant import KVPages

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


if __name__ == "__main__":
    main()
