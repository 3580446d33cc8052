"""Backend selection, the engine-facing entry point, the torch paths and kernel reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvscope.kernels import (
    BackendError,
    flash_attention_varlen,
    paged_attention,
    paged_attention_torch,
    resolve_backend,
)
from kvscope.kernels.backend import visible_pairs
from kvscope.kernels.reference import attention_reference, paged_attention_reference

from support.kernel_cases import cu_seqlens, max_rel_error, paged_batch, poisoned

REPO = Path(__file__).resolve().parents[2]


def test_backend_names_resolve() -> None:
    assert resolve_backend("auto", "cpu") == "torch"
    assert resolve_backend("auto", torch.device("cuda", 0)) == "triton"
    assert resolve_backend("torch", "cuda") == "torch"
    assert resolve_backend("triton", "cpu") == "triton"  # the interpreter is on here
    with pytest.raises(BackendError, match="unknown attention backend 'cudnn'"):
        resolve_backend("cudnn", "cpu")
    assert issubclass(BackendError, ValueError)


def test_triton_refuses_cpu_tensors_without_the_interpreter() -> None:
    script = (
        "import torch, kernels\n"
        "from kernels import AttentionMetadata, KVPages, paged_attention\n"
        "meta = AttentionMetadata.build([[0]], [1], [3], 4)\n"
        "pages = KVPages.allocate(1, 4, 1, 64)\n"
        "try:\n"
        "    paged_attention(torch.randn(1, 2, 64), pages.data, meta, backend='triton')\n"
        "except kernels.BackendError as e:\n"
        "    print(e)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "triton backend needs a CUDA device or TRITON_INTERPRET=1" in done.stdout


def test_visible_pairs_count_the_bottom_right_causal_mask() -> None:
    cases = [(1, 1), (1, 9), (5, 5), (4, 11), (7, 3), (3, 0)]
    for q_len, kv_len in cases:
        pos = torch.arange(q_len)[:, None] + kv_len - q_len
        brute = int((torch.arange(kv_len)[None, :] <= pos).sum())
        assert visible_pairs([q_len], [kv_len], causal=True) == brute
        assert visible_pairs([q_len], [kv_len], causal=False) == q_len * kv_len


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_engine_entry_point_reports_each_call(seed: int, backend: str) -> None:
    batch = paged_batch(
        [1, 7, 21], [23, 7, 50], page_size=16, num_q_heads=9, num_kv_heads=3,
        head_dim=64, kv_dtype="int8", q_dtype=torch.float32,
    )  # fmt: skip
    pages, meta = batch.pages, batch.meta
    events: list[tuple[str, str, float, float, float]] = []
    out = paged_attention(
        batch.q, pages.data, meta, backend, None, "int8", pages.scales,
        on_kernel=lambda *event: events.append(event),
    )  # fmt: skip
    ref = paged_attention_reference(
        batch.q, pages.data, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
        meta.kv_last_page_len, kv_dtype="int8", scales=pages.scales,
    )  # fmt: skip
    assert max_rel_error(out, ref) < 1e-4, f"seed {seed}"
    [(name, shape, seconds, flops, nbytes)] = events
    assert name == f"{backend}.paged_prefill"
    assert shape == "B=3 q=29 kv=80 heads=9/3 D=64 ps=16 int8"
    assert seconds > 0
    pairs = 1 * 23 + 7 * 8 // 2 + (21 * 29 + 21 * 22 // 2)
    assert flops == 4 * pairs * 9 * 64
    # Q read and output written in fp32; K and V: 64 int8 bytes + a 4-byte scale per head.
    assert nbytes == 2 * 29 * 9 * 64 * 4 + 2 * 80 * 3 * (64 + 4)


def test_decode_batches_report_as_decode(seed: int) -> None:
    batch = paged_batch(
        [1, 1], [5, 40], page_size=16, num_q_heads=4, num_kv_heads=2,
        head_dim=64, kv_dtype="fp16", q_dtype=torch.float16,
    )  # fmt: skip
    names = []
    paged_attention(
        batch.q, batch.pages.data, batch.meta, "triton", on_kernel=lambda *e: names.append(e[0])
    )
    assert names == ["triton.paged_decode"]


def test_torch_paths_match_the_reference(seed: int) -> None:
    batch = paged_batch(
        [1, 7, 21, 1], [23, 7, 50, 2], page_size=4, num_q_heads=9, num_kv_heads=3,
        head_dim=64, kv_dtype="fp32", q_dtype=torch.float32,
    )  # fmt: skip
    meta = batch.meta
    out = paged_attention_torch(batch.q, batch.pages.data, meta)  # the engine's call
    ref = attention_reference(batch.q, batch.k, batch.v, meta.cu_seqlens_q, batch.cu_seqlens_k)
    assert max_rel_error(out, ref) < 1e-5, f"seed {seed}"

    cu_q, cu_k = cu_seqlens([3, 20, 1]), cu_seqlens([9, 20, 1])
    q, k, v = torch.randn(24, 4, 64), torch.randn(30, 2, 64), torch.randn(30, 2, 64)
    for causal in (True, False):
        got = flash_attention_varlen(q, k, v, cu_q, cu_k, causal, backend="torch", out=poisoned(q))
        ref = attention_reference(q, k, v, cu_q, cu_k, causal=causal)
        assert max_rel_error(got, ref) < 1e-5, f"seed {seed}"


def test_varlen_refuses_quantized_keys() -> None:
    q = torch.randn(4, 2, 64)
    k = torch.randn(4, 2, 64).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k and v must share"):
        flash_attention_varlen(q, k, k, cu_seqlens([4]), cu_seqlens([4]), backend="triton")
