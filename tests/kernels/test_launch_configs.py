"""Config choice without a GPU: head-dim padding, shared-memory pruning, tuning buckets."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl

from kvscope.kernels.launch_configs import (
    SM90_SHARED_BYTES,
    check_head_dim,
    decode_candidates,
    decode_need,
    fitting,
    length_class,
    padded_head_dim,
    prefill_candidates,
    prefill_need,
)
from kvscope.kernels.triton_kv import FORMAT_CODES

STORED = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "int8": torch.int8,
    "int4": torch.uint8,
    "fp8_e4m3": torch.uint8,
}


def launch(kv_dtype: str, dot: tl.dtype, head_dim: int) -> tuple[dict, torch.Tensor]:
    """The constexprs the pruning sees for a launch, and a K tensor of the stored dtype."""
    kwargs = {
        "FORMAT": FORMAT_CODES[kv_dtype],
        "DOT_DTYPE": dot,
        "BLOCK_D": padded_head_dim(head_dim),
        "BLOCK_H": 16,
    }
    return kwargs, torch.empty(0, dtype=STORED[kv_dtype])


def tiles(config) -> tuple:
    return (*config.kwargs.values(), config.num_warps, config.num_stages)


def test_head_dims_are_multiples_of_8_padded_to_a_power_of_two() -> None:
    pads = {8: 16, 16: 16, 24: 32, 40: 64, 64: 64, 72: 128, 80: 128, 96: 128, 200: 256, 256: 256}
    assert {d: padded_head_dim(d) for d in pads} == pads
    for head_dim in (8, 80, 256):
        check_head_dim(head_dim)
    for head_dim in (0, 4, 12, 100, 264):
        with pytest.raises(ValueError, match=f"multiple of 8 up to 256, got {head_dim}"):
            check_head_dim(head_dim)


def test_fp32_prefill_tiles_shrink_to_fit_sm90() -> None:
    kwargs, kv = launch("fp32", tl.float32, 128)
    need = prefill_need(kwargs, kv)
    by_tiles = {tiles(c): need(c) for c in prefill_candidates()}
    # The config an H200 refused at fp32, head_dim 128 (327,680 bytes of shared memory).
    assert by_tiles[(128, 64, 8, 3)] >= 327_680
    kept = [tiles(c) for c in fitting(prefill_candidates(), need, SM90_SHARED_BYTES)]
    assert kept == [(64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2)]
    kwargs, kv = launch("fp32", tl.float32, 256)
    kept = fitting(prefill_candidates(), prefill_need(kwargs, kv), SM90_SHARED_BYTES)
    assert [tiles(c) for c in kept] == [(32, 32, 4, 2)]


@pytest.mark.parametrize("kv_dtype", ["fp16", "int8", "int4", "fp8_e4m3"])
def test_16_bit_dots_keep_every_prefill_config_up_to_head_dim_128(kv_dtype: str) -> None:
    for head_dim in (64, 96, 128):
        kwargs, kv = launch(kv_dtype, tl.float16, head_dim)
        kept = fitting(prefill_candidates(), prefill_need(kwargs, kv), SM90_SHARED_BYTES)
        assert len(kept) == len(prefill_candidates())


def test_decode_keeps_longer_tiles_for_smaller_formats() -> None:
    def kept_block_n(kv_dtype: str, head_dim: int) -> list[int]:
        kwargs, kv = launch(kv_dtype, tl.float16, head_dim)
        kept = fitting(decode_candidates(), decode_need(kwargs, kv), SM90_SHARED_BYTES)
        return sorted({c.kwargs["BLOCK_N"] for c in kept})

    # 256-token tiles of 1-byte and 4-bit pages fit at every head dim; fp16 ones not at 256.
    for kv_dtype in ("int8", "fp8_e4m3", "int4"):
        assert kept_block_n(kv_dtype, 256) == [32, 64, 128, 256]
    assert kept_block_n("fp16", 128) == [32, 64, 128, 256]
    assert kept_block_n("fp16", 256) == [32, 64, 128]


def test_fitting_falls_back_to_the_smallest_config() -> None:
    kwargs, kv = launch("fp32", tl.float32, 256)
    need = prefill_need(kwargs, kv)
    [only] = fitting(prefill_candidates(), need, limit=1)
    assert need(only) == min(need(c) for c in prefill_candidates())


def test_length_classes_are_powers_of_two() -> None:
    assert [length_class(n) for n in (0, 1, 3, 16, 17, 4096, 4097)] == [1, 1, 4, 16, 32, 4096, 8192]
