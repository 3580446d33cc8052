"""Compile every Triton kernel variant for sm_90 (H100/H200) without a GPU.

The real launchers run on CPU tensors; the kernels' launch is swapped for the
JIT's ``warmup`` (compile, never launch) under a stand-in driver that reports
an sm_90 device, so signatures and specializations are exactly what a GPU run
would compile. Prints one JSON line per compiled kernel with the registers
and local (spill) bytes ``cuobjdump`` reads from the cubin. Needs
TRITON_INTERPRET unset; run by test_sm90_compile.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.backends.nvidia
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class Sm90Driver:
    """Just enough of a driver for the JIT to compile for an H100."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


class CompileOnly:
    """Stands in for a kernel: ``kernel[grid](...)`` compiles and records, never launches."""

    def __init__(self, kernel: triton.JITFunction, sink: list) -> None:
        self.kernel, self.sink = kernel, sink

    def __getitem__(self, grid: tuple):
        def launch(*args, **kwargs) -> None:
            self.sink.append((self.kernel.__name__, self.kernel.warmup(*args, grid=grid, **kwargs)))

        return launch


def resources(cubin: bytes) -> dict[str, int]:
    tool = Path(triton.backends.nvidia.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    fields = dict(
        item.split(":", 1) for item in text.split() if item.startswith(("REG:", "LOCAL:"))
    )
    return {"registers": int(fields["REG"]), "local_bytes": int(fields["LOCAL"])}


def main() -> None:
    driver.set_active(Sm90Driver())
    from kernels import AttentionMetadata, KVPages, triton_decode, triton_prefill

    compiled: list = []
    triton_prefill._prefill_kernel = CompileOnly(triton_prefill._prefill_kernel, compiled)
    triton_decode._decode_split_kernel = CompileOnly(triton_decode._decode_split_kernel, compiled)
    triton_decode._decode_merge_kernel = CompileOnly(triton_decode._decode_merge_kernel, compiled)

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    varlen = [("fp16", "fp16", 32, 8, 128)]  # (q dtype, kv format, Hq, Hkv, D)
    prefill = [
        ("fp16", "fp16", 32, 8, 128),
        ("bf16", "bf16", 9, 3, 64),
        ("fp32", "fp32", 9, 3, 64),
        ("fp16", "int4", 32, 8, 128),
        ("bf16", "int8", 9, 3, 64),
        ("fp16", "fp8_e4m3", 32, 8, 128),
    ]
    decode = [  # ..., and the number of splits (1: the merge runs over a single split)
        ("fp16", "fp16", 32, 8, 128, 4),
        ("bf16", "bf16", 9, 3, 64, 1),
        ("fp32", "fp32", 9, 3, 64, 4),
        ("fp16", "int8", 32, 8, 128, 4),
        ("bf16", "int4", 9, 3, 64, 4),
        ("fp16", "fp8_e5m2", 32, 8, 128, 4),
    ]
    meta = AttentionMetadata.build([[0, 1, 2, 3], [4, 5, 6, 7]], [40, 24], [64, 50], 16)
    decode_meta = AttentionMetadata.build([[0, 1, 2, 3], [4, 5, 6, 7]], [1, 1], [64, 50], 16)
    for kind, cases in (("varlen", varlen), ("prefill", prefill), ("decode", decode)):
        for q_dtype, kv_format, num_q_heads, num_kv_heads, head_dim, *splits in cases:
            pages = KVPages.allocate(8, 16, num_kv_heads, head_dim, kv_format)
            start = len(compiled)
            if kind == "varlen":
                q = torch.zeros(64, num_q_heads, head_dim, dtype=dtypes[q_dtype])
                k = torch.zeros(114, num_kv_heads, head_dim, dtype=dtypes[kv_format])
                triton_prefill.varlen_attention_triton(
                    q, k, k, meta.cu_seqlens_q, torch.tensor([0, 64, 114], dtype=torch.int32),
                    40, causal=False, sm_scale=0.125,
                )  # fmt: skip
            elif kind == "prefill":
                q = torch.zeros(64, num_q_heads, head_dim, dtype=dtypes[q_dtype])
                triton_prefill.paged_prefill_triton(
                    q, pages.data, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
                    meta.kv_last_page_len, 40, kv_format=kv_format, scales=pages.scales,
                    sm_scale=0.125,
                )  # fmt: skip
            else:
                q = torch.zeros(2, num_q_heads, head_dim, dtype=dtypes[q_dtype])
                triton_decode.paged_decode_triton(
                    q, pages.data, decode_meta.kv_indptr, decode_meta.kv_indices,
                    decode_meta.kv_last_page_len, kv_format=kv_format, scales=pages.scales,
                    sm_scale=0.125, max_kv_len=64, num_splits=splits[0],
                )  # fmt: skip
            for name, kernel in compiled[start:]:
                variant = (
                    f"{kind} q={q_dtype} kv={kv_format} H={num_q_heads}/{num_kv_heads} D={head_dim}"
                )
                print(
                    json.dumps(
                        {"kernel": name, "variant": variant, **resources(kernel.asm["cubin"])}
                    )
                )


if __name__ == "__main__":
    main()
