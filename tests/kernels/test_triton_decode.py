"""The split-K paged decode kernel against the float64 reference, in the interpreter."""

from __future__ import annotations

import pytest
import torch

from kvscope.kernels import paged_decode_attention
from kvscope.kernels.reference import paged_attention_reference
from kvscope.kernels.triton_decode import choose_num_splits

from support.kernel_cases import max_rel_error, paged_batch, poisoned

TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
FORMAT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@pytest.mark.parametrize(
    ("page_size", "head_dim", "num_q_heads", "num_kv_heads", "dtype", "num_splits"),
    [
        (1, 64, 2, 2, torch.float32, 1),
        # 4 splits of 32 tokens: the 1- and 16-token requests leave splits empty
        (16, 64, 6, 2, torch.bfloat16, 4),
        (32, 128, 8, 1, torch.float16, None),
        # more splits than a tile each: splits of one 16-token tile, the last one partial
        (16, 64, 4, 1, torch.float32, 7),
    ],
)
def test_decode_matches_reference(
    seed: int,
    page_size: int,
    head_dim: int,
    num_q_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
    num_splits: int | None,
) -> None:
    batch = paged_batch(
        [1, 1, 1, 1], [1, 16, 70, 33],
        page_size=page_size, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, kv_dtype=FORMAT[dtype], q_dtype=dtype,
    )  # fmt: skip
    meta = batch.meta
    out = poisoned(batch.q)
    paged_decode_attention(
        batch.q, batch.pages.data, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len,
        backend="triton", num_splits=num_splits, out=out,
    )  # fmt: skip
    ref = paged_attention_reference(
        batch.q, batch.pages.data, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
        meta.kv_last_page_len,
    )  # fmt: skip
    assert torch.isfinite(out).all(), f"seed {seed}"
    assert max_rel_error(out, ref) < TOLERANCE[dtype], f"seed {seed}"


def test_split_count_fills_the_device_without_short_splits() -> None:
    cpu = torch.device("cpu")  # counts as 8 programs in flight
    assert choose_num_splits(1, 1, 100_000, cpu) == 8
    assert choose_num_splits(1, 1, 300, cpu) == 2  # no split under 256 tokens
    assert choose_num_splits(64, 8, 100_000, cpu) == 1  # the batch alone fills it
