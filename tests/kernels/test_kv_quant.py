"""KV storage formats: round-trip error bounds, bit layout, slot writes, byte cost."""

from __future__ import annotations

import pytest
import torch

from kvscope.engine.sizing import KV_DTYPES
from kvscope.kernels.kv_quant import INT4_GROUP, KVPages, check_pages, dequantize, quantize

QUANTIZED = ["fp8_e4m3", "fp8_e5m2", "int8", "int4"]


def roundtrip(x: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    return dequantize(*quantize(x, kv_dtype), kv_dtype)


@pytest.mark.parametrize(("kv_dtype", "mantissa_bits"), [("fp8_e4m3", 3), ("fp8_e5m2", 2)])
def test_fp8_rounds_to_nearest_and_saturates(seed: int, kv_dtype: str, mantissa_bits: int) -> None:
    x = torch.randn(4096) * 4
    err = (roundtrip(x, kv_dtype) - x).abs()
    # Round to nearest: within half a unit in the last place, 2**-(m+1) relative, for normal values.
    normal = x.abs() > 2**-6
    assert (err[normal] <= x.abs()[normal] * 2 ** -(mantissa_bits + 1)).all(), f"seed {seed}"
    limit = torch.finfo(quantize(x, kv_dtype)[0].dtype).max
    big = torch.tensor([1e9, -1e9])
    assert roundtrip(big, kv_dtype).tolist() == [limit, -limit]


def test_int8_is_symmetric_per_token_head(seed: int) -> None:
    x = torch.randn(5, 3, 64) * torch.rand(5, 3, 1) * 10
    payload, scales = quantize(x, "int8")
    assert payload.dtype == torch.int8 and scales.shape == (5, 3)
    assert torch.allclose(scales, x.abs().amax(-1) / 127)
    assert payload.abs().amax(-1).eq(127).all()  # the largest element uses the full range
    err = (dequantize(payload, scales, "int8") - x).abs()
    assert (err <= scales[..., None] / 2 * (1 + 1e-5)).all(), f"seed {seed}"
    assert dequantize(*quantize(torch.zeros(2, 64), "int8"), "int8").eq(0).all()


def test_int4_packs_groups_with_scale_and_minimum(seed: int) -> None:
    x = torch.randn(6, 2, 128) + torch.randn(6, 2, 1) * 3  # offset groups, as K has
    payload, scales = quantize(x, "int4")
    assert payload.shape == (6, 2, 64) and payload.dtype == torch.uint8
    assert scales.shape == (6, 2, 128 // INT4_GROUP, 2) and scales.dtype == torch.float16
    groups = x.unflatten(-1, (-1, INT4_GROUP))
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    err = (dequantize(payload, scales, "int4") - x).abs().unflatten(-1, (-1, INT4_GROUP))
    # Half a step, plus fp16 rounding of the stored scale and minimum.
    bound = step / 2 + groups.abs().amax(-1) * 2**-10
    assert (err <= bound[..., None]).all(), f"seed {seed}"


def test_int4_nibble_order() -> None:
    # One group spanning 0..15 quantizes with scale 1 and minimum 0: codes equal values.
    codes = torch.tensor([(7 * i) % 16 for i in range(32)], dtype=torch.uint8)
    payload, scales = quantize(codes.float(), "int4")
    assert scales.tolist() == [[1.0, 0.0]]
    assert torch.equal(payload, codes[0::2] | (codes[1::2] << 4))  # element 2j low, 2j+1 high


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "bf16", *QUANTIZED])
def test_pages_write_slots_and_cost_what_sizing_says(seed: int, kv_dtype: str) -> None:
    pages = KVPages.allocate(5, 4, 3, 64, kv_dtype)
    slots = torch.tensor([17, 2, 8])
    k, v = torch.randn(3, 3, 64), torch.randn(3, 3, 64)
    pages.write(slots, k, v)
    full = pages.dequantize()
    for i, slot in enumerate(slots.tolist()):
        page, offset = divmod(slot, 4)
        assert torch.equal(full[page, 0, offset], roundtrip(k[i], kv_dtype))
        assert torch.equal(full[page, 1, offset], roundtrip(v[i], kv_dtype))
    untouched = torch.ones(5 * 4, dtype=torch.bool)
    untouched[slots] = False
    assert full.transpose(0, 1).reshape(2, 20, 3, 64)[:, untouched].eq(0).all()
    per_head_vector = pages.nbytes / (5 * 2 * 4 * 3)
    assert per_head_vector == KV_DTYPES[kv_dtype].bytes_per_head_vector(64)
    assert check_pages(pages.data, pages.scales, kv_dtype, 64) == kv_dtype


def test_pages_refuse_a_mismatched_format() -> None:
    pages = KVPages.allocate(2, 4, 1, 64, "int8")
    with pytest.raises(ValueError, match="needs scales"):
        check_pages(pages.data, None, "int8", 64)
    with pytest.raises(ValueError, match="explicit kv_dtype"):
        check_pages(pages.data, pages.scales, None, 64)
    with pytest.raises(ValueError, match="stored as"):
        check_pages(pages.data, pages.scales, "fp16", 64)
    with pytest.raises(ValueError, match="unknown KV format"):
        KVPages.allocate(2, 4, 1, 64, "int3")
