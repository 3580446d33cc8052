"""Compile every Triton kernel config for sm_90 (H100/H200) without a GPU.

The real launchers run on CPU tensors under a stand-in driver that reports
an sm_90 device; the autotuned kernels are swapped for a stand-in that, for
each launch, compiles (never launches) every candidate config the autotuner
would time on a 227 KiB device, through the JIT's own ``warmup``, so
signatures and specializations are exactly what a GPU run would compile.
Variants cover the query dtypes, KV formats and every head-dim class (tiles
16 to 256 wide, reached from head dims that need padding).

The first config of each launch compiles to a cubin, whose registers and
local (spill) bytes ``cuobjdump`` reads; the others stop after LLVM IR,
where the compiler has already allocated shared memory: ptxas is most of a
compile's time. Prints one JSON line per compiled kernel, with the shared
memory allocated and the estimate the autotuner prunes with. Needs
TRITON_INTERPRET unset; run by tests/kernels/test_sm90_compile.py as
``python -m support.sm90_compile PART PARTS`` from tests/.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.backends.nvidia
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

# fp32 tiles need the most shared memory (4-byte loads, Q twice for the
# "tf32x3" dots), so fp32 runs at every tile width, 16 to 256, reached from
# head dims that need padding; the other formats at the widths they stress.
FP32_HEAD_DIMS = (8, 24, 40, 96, 200)
# (kind, q dtype, KV format, Hq, Hkv, head dims)
VARIANTS = [
    ("varlen", "fp16", "fp16", 32, 8, (80,)),
    ("prefill", "fp32", "fp32", 9, 3, FP32_HEAD_DIMS),
    ("prefill", "fp16", "fp16", 32, 8, (96, 200)),
    ("prefill", "bf16", "bf16", 9, 3, (64,)),
    ("prefill", "fp16", "int4", 32, 8, (96,)),
    ("prefill", "fp32", "int8", 9, 3, (200,)),
    ("prefill", "fp16", "fp8_e4m3", 32, 8, (128,)),
    ("decode", "fp32", "fp32", 9, 3, FP32_HEAD_DIMS),
    ("decode", "fp16", "fp16", 32, 8, (96, 200)),
    ("decode", "bf16", "bf16", 9, 3, (64,)),
    ("decode", "fp16", "int4", 32, 8, (96,)),
    ("decode", "fp16", "int8", 32, 8, (128,)),
    ("decode", "fp16", "fp8_e5m2", 32, 8, (80,)),
]


class Sm90Driver:
    """Just enough of a driver for the JIT to compile for an H100."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def stop_after_llvm_ir(*args):
    """A stage hook: no PTX, no cubin. Called bare, it names itself for the cache key."""
    if not args:
        return "stop-after-llir", "stop-after-llir"

    def no_ptx(llir: str, metadata: dict) -> str:
        # The PTX stage is where the kernel's name is read; take it from the IR instead.
        metadata["name"] = re.search(r"define ptx_kernel void @(\w+)\(", llir).group(1)
        return ""

    stages = args[1]
    stages["ptx"] = no_ptx
    stages["cubin"] = lambda src, metadata: b""
    return None


class CompileOnly:
    """Stands in for a kernel: ``kernel[grid](...)`` compiles and records, never launches.

    An autotuned kernel compiles each config its pruning keeps for an sm_90
    device; ``need`` is the pruning's shared-memory estimate for the launch.
    """

    def __init__(self, kernel, sink: list, need=None) -> None:
        self.kernel, self.sink, self.need = kernel, sink, need

    def __getitem__(self, grid):
        from kvscope.kernels.launch_configs import SM90_SHARED_BYTES, fitting

        def launch(*args, **kwargs) -> None:
            if self.need is None:
                compiled = self.kernel.warmup(*args, grid=grid, **kwargs)
                self.sink.append((self.kernel.__name__, "", compiled, None))
                return
            nargs = dict(zip(self.kernel.arg_names, args, strict=False))
            need = self.need(kwargs, nargs["K"])
            for i, config in enumerate(fitting(self.kernel.configs, need, SM90_SHARED_BYTES)):
                knobs.runtime.add_stages_inspection_hook = None if i == 0 else stop_after_llvm_ir
                try:
                    compiled = self.kernel.fn.warmup(
                        *args, grid=grid, **kwargs, **config.all_kwargs()
                    )
                finally:
                    knobs.runtime.add_stages_inspection_hook = None
                self.sink.append((self.kernel.fn.__name__, str(config), compiled, need(config)))

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


def main(part: int = 0, parts: int = 1) -> None:
    """Compile every ``parts``-th variant from ``part`` on (the test runs the parts at once)."""
    driver.set_active(Sm90Driver())
    from kvscope.kernels import (
        AttentionMetadata,
        KVPages,
        launch_configs,
        triton_decode,
        triton_prefill,
    )

    compiled: list = []
    triton_prefill._prefill_kernel = CompileOnly(
        triton_prefill._prefill_kernel, compiled, launch_configs.prefill_need
    )
    triton_decode._decode_split_kernel = CompileOnly(
        triton_decode._decode_split_kernel, compiled, launch_configs.decode_need
    )
    triton_decode._decode_merge_kernel = CompileOnly(triton_decode._decode_merge_kernel, compiled)

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    meta = AttentionMetadata.build([[0, 1, 2, 3], [4, 5, 6, 7]], [40, 24], [64, 50], 16)
    decode_meta = AttentionMetadata.build([[0, 1, 2, 3], [4, 5, 6, 7]], [1, 1], [64, 50], 16)
    mine = [(v, d) for v in VARIANTS for d in v[5]][part::parts]
    for (kind, q_dtype, kv_dtype, num_q_heads, num_kv_heads, _), head_dim in mine:
        pages = KVPages.allocate(8, 16, num_kv_heads, head_dim, kv_dtype)
        start = len(compiled)
        if kind == "varlen":
            q = torch.zeros(64, num_q_heads, head_dim, dtype=dtypes[q_dtype])
            k = torch.zeros(114, num_kv_heads, head_dim, dtype=dtypes[kv_dtype])
            triton_prefill.varlen_attention_triton(
                q, k, k, meta.cu_seqlens_q, torch.tensor([0, 64, 114], dtype=torch.int32),
                40, causal=False, sm_scale=0.125,
            )  # fmt: skip
        elif kind == "prefill":
            q = torch.zeros(64, num_q_heads, head_dim, dtype=dtypes[q_dtype])
            triton_prefill.paged_prefill_triton(
                q, pages.data, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
                meta.kv_last_page_len, 40, kv_dtype=kv_dtype, scales=pages.scales,
                sm_scale=0.125,
            )  # fmt: skip
        else:
            q = torch.zeros(2, num_q_heads, head_dim, dtype=dtypes[q_dtype])
            triton_decode.paged_decode_triton(
                q, pages.data, decode_meta.kv_indptr, decode_meta.kv_indices,
                decode_meta.kv_last_page_len, kv_dtype=kv_dtype, scales=pages.scales,
                sm_scale=0.125, max_kv_len=64, num_splits=4,
            )  # fmt: skip
        variant = f"{kind} q={q_dtype} kv={kv_dtype} H={num_q_heads}/{num_kv_heads} D={head_dim}"
        for name, config, kernel, estimate in compiled[start:]:
            cubin = kernel.asm["cubin"]
            record = {
                "kernel": name,
                "variant": variant,
                "config": config,
                **(resources(cubin) if cubin else {}),
                "shared_bytes": kernel.metadata.shared,
                "estimate": estimate,
            }
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
