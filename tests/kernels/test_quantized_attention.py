"""Attention over every KV storage format, Triton (interpreter) and torch paths.

Two checks per format. The kernel check compares against the float64
reference over the *same* dequantized K/V, so only the kernel's arithmetic
differs (fp32 queries: exact fp32 products). The format check compares against
the float64 reference over the K/V *before* quantization, with the bound

    ||out - ref|| / ||ref||  <=  2 * eps,   eps = ||KV_q - KV|| / ||KV||

measured on the test's own K/V. Why: a K error moves the logits and a V error
moves the weighted average, each by about eps relative, and the two are
independent, so they add in quadrature to about sqrt(2) * eps (1.41-1.49 times
eps over 200 random batches, for every format); 2 leaves margin. eps itself
stays under the format's unit error: the float formats' half ulp (fp16 2**-11,
bf16 2**-8, e4m3 2**-4, e5m2 2**-3), int8's half step amax/254 (amax is about
4 sigma for 64 normal values: 1/64), int4's half step range/30 (a 32-value
group spans about 6 sigma: 1/5).
"""

from __future__ import annotations

import pytest
import torch

from kvscope.kernels import paged_attention
from kvscope.kernels.reference import (
    attention_reference,
    gather_sequences,
    paged_attention_reference,
)

from support.kernel_cases import max_rel_error, norm_rel_error, paged_batch, poisoned

UNIT_ERROR = {
    "fp16": 2**-11,
    "bf16": 2**-8,
    "fp8_e4m3": 2**-4,
    "fp8_e5m2": 2**-3,
    "int8": 1 / 64,
    "int4": 1 / 5,
}
PREFILL = ([1, 7, 21], [23, 7, 50])  # a decode row, a fresh prompt, new tokens after a prefix
DECODE = ([1, 1, 1, 1], [1, 16, 70, 33])


@pytest.mark.parametrize("kv_dtype", list(UNIT_ERROR))
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(
    ("lengths", "page_size", "head_dim"),
    [(PREFILL, 16, 64), (DECODE, 16, 64), (DECODE, 1, 128), (PREFILL, 32, 128)],
    ids=["prefill-ps16-d64", "decode-ps16-d64", "decode-ps1-d128", "prefill-ps32-d128"],
)
def test_format_error_is_bounded(
    seed: int,
    kv_dtype: str,
    backend: str,
    lengths: tuple[list[int], list[int]],
    page_size: int,
    head_dim: int,
) -> None:
    query_lens, kv_lens = lengths
    batch = paged_batch(
        query_lens, kv_lens, page_size=page_size, num_q_heads=9, num_kv_heads=3,
        head_dim=head_dim, kv_dtype=kv_dtype, q_dtype=torch.float32,
    )  # fmt: skip
    pages, meta = batch.pages, batch.meta
    out = poisoned(batch.q)
    paged_attention(
        batch.q, pages.data, meta, backend=backend, kv_dtype=kv_dtype, scales=pages.scales,
        num_splits=3, out=out,
    )  # fmt: skip
    assert torch.isfinite(out).all(), f"seed {seed}"

    same_kv = paged_attention_reference(
        batch.q, pages.data, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
        meta.kv_last_page_len, kv_dtype=kv_dtype, scales=pages.scales,
    )  # fmt: skip
    assert max_rel_error(out, same_kv) < 1e-4, f"seed {seed}"

    true_kv = attention_reference(batch.q, batch.k, batch.v, meta.cu_seqlens_q, batch.cu_seqlens_k)
    k_q, v_q, _ = gather_sequences(
        pages.dequantize(), meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len
    )
    eps = norm_rel_error(torch.cat([k_q, v_q]), torch.cat([batch.k, batch.v]).double())
    assert eps < UNIT_ERROR[kv_dtype], f"seed {seed}"
    assert norm_rel_error(out, true_kv) < 2 * eps, f"seed {seed}"
