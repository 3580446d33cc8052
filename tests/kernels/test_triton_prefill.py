"""The Triton prefill kernel against the float64 reference, in the interpreter."""

from __future__ import annotations

import pytest
import torch

from kvscope.kernels import flash_attention_varlen, paged_attention
from kvscope.kernels.reference import attention_reference, paged_attention_reference

from support.kernel_cases import cu_seqlens, max_rel_error, paged_batch, poisoned

# fp32 runs exact fp32 products; fp16 feeds tensor-core-style fp16 products
# (probabilities rounded to fp16); bf16 outputs are rounded to bf16.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize(
    ("head_dim", "num_q_heads", "num_kv_heads", "dtype", "causal", "query_lens", "kv_lens"),
    [
        # self-attention, lengths 1 and across tile edges (tiles are 16 here)
        (64, 2, 2, torch.float32, True, [1, 17, 33], [1, 17, 33]),
        # queries after a prefix (bottom-right aligned), GQA 4
        (128, 4, 1, torch.float16, True, [5, 20], [37, 20]),
        # not causal, GQA 3, a one-token key sequence
        (64, 6, 2, torch.bfloat16, False, [16, 7], [40, 1]),
        # more queries than keys: the first 11 queries see nothing and output zeros
        (64, 8, 1, torch.float32, True, [20], [9]),
    ],
)
def test_varlen_matches_reference(
    seed: int,
    head_dim: int,
    num_q_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
    causal: bool,
    query_lens: list[int],
    kv_lens: list[int],
) -> None:
    q = torch.randn(sum(query_lens), num_q_heads, head_dim).to(dtype)
    k = torch.randn(sum(kv_lens), num_kv_heads, head_dim).to(dtype)
    v = torch.randn(sum(kv_lens), num_kv_heads, head_dim).to(dtype)
    cu_q, cu_k = cu_seqlens(query_lens), cu_seqlens(kv_lens)
    out = poisoned(q)
    got = flash_attention_varlen(q, k, v, cu_q, cu_k, causal=causal, backend="triton", out=out)
    assert got is out
    ref = attention_reference(q, k, v, cu_q, cu_k, causal=causal)
    assert torch.isfinite(out).all(), f"seed {seed}"
    assert max_rel_error(out, ref) < TOLERANCE[dtype], f"seed {seed}"
    if query_lens[0] > kv_lens[0] and causal:
        assert (out[: query_lens[0] - kv_lens[0]] == 0).all()


@pytest.mark.parametrize(
    ("page_size", "head_dim", "num_q_heads", "num_kv_heads", "dtype"),
    [
        (1, 64, 2, 2, torch.float32),
        (16, 128, 4, 1, torch.float16),
        (32, 64, 6, 2, torch.bfloat16),
        (16, 64, 8, 1, torch.float32),
    ],
)
def test_paged_prefill_over_cached_prefix(
    seed: int,
    page_size: int,
    head_dim: int,
    num_q_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
) -> None:
    # A decode row, a fresh 7-token prompt, and 21 new tokens after a 29-token cached prefix.
    batch = paged_batch(
        [1, 7, 21], [23, 7, 50],
        page_size=page_size, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, kv_dtype={torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype],
        q_dtype=dtype,
    )  # fmt: skip
    out = poisoned(batch.q)
    paged_attention(batch.q, batch.pages.data, batch.meta, backend="triton", out=out)
    meta = batch.meta
    ref = paged_attention_reference(
        batch.q, batch.pages.data, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
        meta.kv_last_page_len,
    )  # fmt: skip
    assert torch.isfinite(out).all(), f"seed {seed}"
    assert max_rel_error(out, ref) < TOLERANCE[dtype], f"seed {seed}"
