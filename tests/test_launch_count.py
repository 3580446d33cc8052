"""The CUDA decode path's kernel launches per layer, counted on the CPU (kvscope.profiler.launch_count):
a regression that adds a launch to every layer fails here."""

from __future__ import annotations

import dataclasses

from kvscope.engine.model import cpu_packs_bf16
from kvscope.engine.presets import model_preset
from kvscope.profiler import launch_count

# The fused path: add+RMSNorm x2, QKV, RoPE+KV write, decode split + merge, O,
# gate-up, SiLU*mul, down. Llama-3-8B's layer shape at a tiny width (counts don't
# depend on widths, only on head_dim being one the fused write handles).
FUSED_PER_LAYER = 10


def per_layer(path: str, kv_dtype: str) -> tuple[int, dict]:
    base = dataclasses.replace(
        model_preset("llama3-8b"), hidden_size=256, intermediate_size=512, num_q_heads=4,
        num_kv_heads=2, head_dim=64, vocab_size=128,
    )  # fmt: skip
    one, two = (
        launch_count.count_step(
            dataclasses.replace(base, num_layers=n), "bf16", kv_dtype, path=path
        )
        for n in (1, 2)
    )
    diff = two.copy()
    diff.subtract(one)
    return sum(diff.values()), {k: v for k, v in diff.items() if v}


def test_cuda_decode_path_launches_ten_kernels_per_layer() -> None:
    for kv_dtype in ("bf16", "int8"):
        count, ops = per_layer("cuda", kv_dtype)
        assert count == FUSED_PER_LAYER, (kv_dtype, ops)
        assert ops["triton:_rope_kv_kernel"] == 1 and ops["linear"] == 4


def test_cpu_torch_path_keeps_its_fusions() -> None:
    # The one-row RMSNorm x2 (neg, cat, layer_norm: batch 1 in bf16), QKV, RoPE (roll,
    # mul, mul, add), one index_put for K and V, gather (K, V) + SDPA, O and down with the
    # residual inside, gate-up, silu, mul. bf16 weights on the CPU are oneDNN-packed: all
    # four GEMMs are one _linear_pointwise each (the residual add is its binary form).
    count, ops = per_layer("cpu", "bf16")
    assert count == 20, ops
    if cpu_packs_bf16():
        assert ops["_linear_pointwise"] == 4 and ops.get("linear", 0) == ops.get("addmm", 0) == 0
    else:  # a CPU without AVX-512 keeps plain weights: QKV, gate-up linear; O, down addmm
        assert ops["linear"] == ops["addmm"] == 2 and "_linear_pointwise" not in ops
    assert ops["index_put_"] == 1 and ops.get("to", 0) == 0 and ops.get("add", 0) == 1, ops
