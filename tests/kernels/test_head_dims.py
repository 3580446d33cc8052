"""Head dims that are not a power of two, in every KV format, against the float64 reference.

The kernels pad a head dim to the next power of two inside their tiles. Queries
are views into wider rows of junk and outputs views into wider rows of NaN, so
a kernel that reads a query column past the head dim, or writes one, fails.
"""

from __future__ import annotations

import pytest
import torch

from kvscope.kernels import flash_attention_varlen, paged_attention
from kvscope.kernels.kv_quant import INT4_GROUP
from kvscope.kernels.reference import attention_reference, paged_attention_reference

from support.kernel_cases import cu_seqlens, max_rel_error, paged_batch

TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
# Each quantized format runs with a different query dtype, so every dot dtype
# meets a dequantizing load somewhere (int8 keys enter fp16 dots as codes).
Q_DTYPE = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float16,
    "fp8_e5m2": torch.bfloat16,
    "int8": torch.float16,
    "int4": torch.float32,
}
CASES = [
    (head_dim, kv_dtype)
    for head_dim in (40, 80, 96)
    for kv_dtype in Q_DTYPE
    if kv_dtype != "int4" or head_dim % INT4_GROUP == 0
] + [(8, "fp16"), (8, "int8"), (200, "bf16"), (224, "int4")]
PREFILL = ([1, 7, 21], [23, 7, 50])  # a decode row, a fresh prompt, new tokens after a prefix
DECODE = ([1, 1, 1, 1], [1, 16, 70, 33])
GUARD = 8  # extra columns around each row of q and out


def in_wider_rows(x: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` as a view whose rows end ``GUARD`` columns before the next row; and the whole buffer."""
    wide = torch.full((*x.shape[:-1], x.shape[-1] + GUARD), fill, dtype=x.dtype)
    view = wide[..., : x.shape[-1]]
    view.copy_(x)
    return view, wide


@pytest.mark.parametrize("kind", ["prefill", "decode"])
@pytest.mark.parametrize(("head_dim", "kv_dtype"), CASES)
def test_paged_kernels_at_any_head_dim(seed: int, head_dim: int, kv_dtype: str, kind: str) -> None:
    query_lens, kv_lens = PREFILL if kind == "prefill" else DECODE
    q_dtype = Q_DTYPE[kv_dtype]
    batch = paged_batch(
        query_lens, kv_lens, page_size=16, num_q_heads=4, num_kv_heads=2,
        head_dim=head_dim, kv_dtype=kv_dtype, q_dtype=q_dtype,
    )  # fmt: skip
    pages, meta = batch.pages, batch.meta
    q, _ = in_wider_rows(batch.q, 1e4)
    out, out_rows = in_wider_rows(torch.empty_like(batch.q), float("nan"))
    paged_attention(
        q, pages.data, meta, "triton", kv_dtype=kv_dtype, scales=pages.scales,
        num_splits=3, out=out,
    )  # fmt: skip
    ref = paged_attention_reference(
        batch.q, pages.data, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
        meta.kv_last_page_len, kv_dtype=kv_dtype, scales=pages.scales,
    )  # fmt: skip
    assert torch.isfinite(out).all(), f"seed {seed}"
    assert out_rows[..., head_dim:].isnan().all(), f"wrote past head_dim; seed {seed}"
    assert max_rel_error(out, ref) < TOLERANCE[q_dtype], f"seed {seed}"


@pytest.mark.parametrize(
    ("head_dim", "dtype"), [(40, torch.float32), (80, torch.float16), (96, torch.bfloat16)]
)
def test_varlen_at_any_head_dim(seed: int, head_dim: int, dtype: torch.dtype) -> None:
    query_lens, kv_lens = [5, 20], [37, 20]
    q = torch.randn(sum(query_lens), 4, head_dim).to(dtype)
    k, v = (torch.randn(sum(kv_lens), 2, head_dim).to(dtype) for _ in range(2))
    cu_q, cu_k = cu_seqlens(query_lens), cu_seqlens(kv_lens)
    q_view, _ = in_wider_rows(q, 1e4)
    out, out_rows = in_wider_rows(torch.empty_like(q), float("nan"))
    flash_attention_varlen(q_view, k, v, cu_q, cu_k, causal=True, backend="triton", out=out)
    ref = attention_reference(q, k, v, cu_q, cu_k, causal=True)
    assert out_rows[..., head_dim:].isnan().all(), f"wrote past head_dim; seed {seed}"
    assert max_rel_error(out, ref) < TOLERANCE[dtype], f"seed {seed}"


@pytest.mark.parametrize("head_dim", [12, 264])
def test_head_dims_the_kernels_refuse(head_dim: int) -> None:
    batch = paged_batch(
        [1], [5], page_size=16, num_q_heads=2, num_kv_heads=1,
        head_dim=head_dim, kv_dtype="fp32", q_dtype=torch.float32,
    )  # fmt: skip
    with pytest.raises(ValueError, match=f"multiple of 8 up to 256, got {head_dim}"):
        paged_attention(batch.q, batch.pages.data, batch.meta, "triton")
    # The torch path has no tile to pad and takes any head dim.
    out = paged_attention(batch.q, batch.pages.data, batch.meta, "torch")
    ref = attention_reference(
        batch.q, batch.k, batch.v, batch.meta.cu_seqlens_q, batch.cu_seqlens_k
    )
    assert max_rel_error(out, ref) < 1e-5
