"""paged_attention works out its backend, the pages' check and its cost once per step (the
metadata's cache) and reuses them for every layer: the figures each layer reports must be
the ones worked out afresh, and pages that do not fit must still be refused."""

from __future__ import annotations

import pytest
import torch

from kvscope.kernels import AttentionMetadata, KVPages, paged_attention
from kvscope.kernels.backend import paged_attention_cost
from kvscope.kernels.torch_paged import paged_attention_torch


def _pools(kv_dtype: str, n: int) -> list[KVPages]:
    g = torch.Generator().manual_seed(len(kv_dtype))
    pools = []
    for _ in range(n):
        pool = KVPages.allocate(6, 4, 2, 32, kv_dtype)
        kv = torch.randn(2, 24, 2, 32, generator=g)
        pool.write(torch.arange(24), kv[0], kv[1])
        pools.append(pool)
    return pools


def test_every_layer_reports_the_fresh_figures() -> None:
    meta = AttentionMetadata.build([[0, 1, 2], [3, 4]], [1, 1], [11, 6], 4)
    q = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(1))
    reports: list[tuple] = []
    for kv_dtype in ("fp32", "int8", "fp32"):  # a change of format on one metadata
        for pool in _pools(kv_dtype, 3):
            out = paged_attention(
                q, pool.data, meta, "torch", kv_dtype=kv_dtype, scales=pool.scales,
                on_kernel=lambda *r: reports.append(r),
            )  # fmt: skip
            fresh = AttentionMetadata.build([[0, 1, 2], [3, 4]], [1, 1], [11, 6], 4)
            want = paged_attention_cost(q, pool.data, pool.scales, fresh, kv_dtype)
            name, shape, seconds, flops, nbytes = reports[-1]
            assert (name, shape, flops, nbytes) == ("torch.paged_decode", *want)
            assert seconds > 0
            ref = paged_attention_torch(q, pool.data, fresh, None, kv_dtype, pool.scales)
            assert torch.equal(out, ref)
    fp32_bytes, int8_bytes = reports[0][4], reports[3][4]
    assert int8_bytes < fp32_bytes and reports[6][4] == fp32_bytes


def test_pages_that_do_not_fit_are_refused_after_a_good_call() -> None:
    meta = AttentionMetadata.build([[0, 1]], [1], [7], 4)
    q = torch.randn(1, 4, 32)
    (pool,) = _pools("int8", 1)
    paged_attention(q, pool.data, meta, "torch", kv_dtype="int8", scales=pool.scales)
    with pytest.raises(ValueError, match="needs scales"):
        paged_attention(q, pool.data, meta, "torch", kv_dtype="int8", scales=None)
    with pytest.raises(ValueError, match="needs scales shaped"):
        paged_attention(q, pool.data, meta, "torch", kv_dtype="int8", scales=pool.scales[:3])
    with pytest.raises(ValueError, match="last dim"):
        paged_attention(q[..., :16], pool.data, meta, "torch", kv_dtype="int8", scales=pool.scales)
