"""RoPE fused with the KV-cache write (and its quantisation), in Triton: one launch per layer.

The torch path rotates Q and K (several ops), splits every slot into (page,
offset) and scatters K and V with ``index_put``, quantising first for the
integer formats: about ten kernels per layer on a GPU. Here one program per
(token, head) reads its head of the QKV projection once: a query head is
rotated and stored to ``q`` in the attention's dtype; a KV head has its K
rotated, K and V quantised in registers (the ``kernels/kv_quant.py`` layout,
scales included) and stored straight into its page, the slot divided into
page and offset in registers. Rotate-half RoPE (Hugging Face layout) reads the
two halves of a head as two vectors, so no shuffle is needed; int4 groups
(32 along head_dim) then never straddle the halves when half the head dim is
a multiple of 32 (head dims 64, 128, 256); other int4 head dims fall back to
the torch write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvscope.kernels.kv_quant import INT4_GROUP, KVPages
from kvscope.kernels.triton_kv import FORMAT_CODES, kernel_view

_FP8_MAX = {1: 448.0, 2: 57344.0}


@triton.jit
def _round(x):
    """Round half away from zero (torch rounds half to even: only exact ties differ)."""
    return tl.where(x >= 0, tl.floor(x + 0.5), -tl.floor(0.5 - x))


@triton.jit
def _round_mantissa(x, BITS: tl.constexpr):
    """``x`` rounded to nearest-even at ``BITS`` mantissa bits, in fp32 bits.

    The fp8 conversion then has nothing left to round (for normal values), so it
    cannot get the carry into the exponent wrong: Triton's interpreter does (a
    value that rounds up to a power of two comes out half as large).
    """
    SHIFT: tl.constexpr = 23 - BITS
    bits = x.to(tl.int32, bitcast=True)
    bits += (1 << (SHIFT - 1)) - 1 + ((bits >> SHIFT) & 1)
    return (bits & ~((1 << SHIFT) - 1)).to(tl.float32, bitcast=True)


@triton.jit
def _store_int4_half(x, Out, Scales, offs_b, g_base, HALF: tl.constexpr, INT4_GROUP: tl.constexpr):
    """One half of a head vector, ``x [HALF]``, as packed nibbles and (scale, min) pairs."""
    groups = tl.reshape(x, (HALF // INT4_GROUP, INT4_GROUP))
    low = tl.min(groups, 1).to(tl.float16)
    scale = ((tl.max(groups, 1) - low.to(tl.float32)) / 15.0).to(tl.float16)
    safe = tl.where(scale > 0, scale.to(tl.float32), 1.0)
    q = (groups - low.to(tl.float32)[:, None]) / safe[:, None]
    q = tl.minimum(tl.maximum(_round(q), 0.0), 15.0).to(tl.int32)
    even, odd = tl.split(tl.reshape(q, (HALF // 2, 2)))
    tl.store(Out + offs_b, (even | (odd << 4)).to(tl.uint8))
    offs_g = g_base + tl.arange(0, HALF // INT4_GROUP)
    tl.store(Scales + 2 * offs_g, scale)
    tl.store(Scales + 2 * offs_g + 1, low)


@triton.jit
def _store_kv(
    lo,
    hi,
    Out,
    Scales,
    offs,
    mask,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    FORMAT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    INT4_GROUP: tl.constexpr,
):
    """A head vector given as its two halves, stored in the page's format at ``Out``."""
    if FORMAT == 0:
        tl.store(Out + offs, lo.to(Out.dtype.element_ty), mask=mask)
        tl.store(Out + HALF + offs, hi.to(Out.dtype.element_ty), mask=mask)
    if FORMAT == 1:
        lo8 = _round_mantissa(tl.minimum(tl.maximum(lo, -FP8_MAX), FP8_MAX), 3)
        hi8 = _round_mantissa(tl.minimum(tl.maximum(hi, -FP8_MAX), FP8_MAX), 3)
        tl.store(Out + offs, lo8.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)
        tl.store(Out + HALF + offs, hi8.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)
    if FORMAT == 2:
        lo8 = _round_mantissa(tl.minimum(tl.maximum(lo, -FP8_MAX), FP8_MAX), 2)
        hi8 = _round_mantissa(tl.minimum(tl.maximum(hi, -FP8_MAX), FP8_MAX), 2)
        tl.store(Out + offs, lo8.to(tl.float8e5).to(tl.uint8, bitcast=True), mask=mask)
        tl.store(Out + HALF + offs, hi8.to(tl.float8e5).to(tl.uint8, bitcast=True), mask=mask)
    if FORMAT == 3:
        amax = tl.maximum(tl.max(tl.abs(lo), 0), tl.max(tl.abs(hi), 0))
        scale = amax / 127.0
        safe = tl.where(scale > 0, scale, 1.0)
        qlo = tl.minimum(tl.maximum(_round(lo / safe), -127.0), 127.0).to(tl.int8)
        qhi = tl.minimum(tl.maximum(_round(hi / safe), -127.0), 127.0).to(tl.int8)
        tl.store(Out + offs, qlo, mask=mask)
        tl.store(Out + HALF + offs, qhi, mask=mask)
        tl.store(Scales, scale)
    if FORMAT == 4:
        offs_b = tl.arange(0, HALF // 2)
        _store_int4_half(lo, Out, Scales, offs_b, 0, HALF, INT4_GROUP)
        _store_int4_half(hi, Out, Scales, HALF // 2 + offs_b, HALF // INT4_GROUP, HALF, INT4_GROUP)


@triton.jit
def _rope_kv_kernel(
    QKV,
    Positions,
    Cos,
    Sin,
    Slots,
    Q,
    Pages,
    Scales,
    stride_qkv,
    stride_cos,
    stride_qt,
    stride_qh,
    s_pp,
    s_pw,
    s_pt,
    s_ph,
    s_sp,
    s_sw,
    s_st,
    s_sh,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAYLOAD_DIM: tl.constexpr,
    FORMAT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    INT4_GROUP: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    pos = tl.load(Positions + tok)
    cos = tl.load(Cos + pos * stride_cos + offs, mask=mask, other=0).to(tl.float32)
    sin = tl.load(Sin + pos * stride_cos + offs, mask=mask, other=0).to(tl.float32)
    src = QKV + tok * stride_qkv + head * HEAD_DIM
    x1 = tl.load(src + offs, mask=mask, other=0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=mask, other=0).to(tl.float32)
    lo = x1 * cos - x2 * sin
    hi = x2 * cos + x1 * sin
    if head < NUM_Q_HEADS:
        dst = Q + tok * stride_qt + head * stride_qh
        tl.store(dst + offs, lo.to(Q.dtype.element_ty), mask=mask)
        tl.store(dst + HALF + offs, hi.to(Q.dtype.element_ty), mask=mask)
    else:
        kv_head = head - NUM_Q_HEADS
        slot = tl.load(Slots + tok)
        page = slot // PAGE_SIZE
        at = page * s_pp + (slot % PAGE_SIZE) * s_pt + kv_head * s_ph
        scale_at = page * s_sp + (slot % PAGE_SIZE) * s_st + kv_head * s_sh
        # K as it rounds to the activation dtype, as the torch path stores it.
        lo = lo.to(QKV.dtype.element_ty).to(tl.float32)
        hi = hi.to(QKV.dtype.element_ty).to(tl.float32)
        _store_kv(lo, hi, Pages + at, Scales + scale_at, offs, mask,
                  HALF, BLOCK_HALF, FORMAT, FP8_MAX, INT4_GROUP)  # fmt: skip
        v_src = src + NUM_KV_HEADS * HEAD_DIM
        v1 = tl.load(v_src + offs, mask=mask, other=0).to(tl.float32)
        v2 = tl.load(v_src + HALF + offs, mask=mask, other=0).to(tl.float32)
        _store_kv(v1, v2, Pages + at + s_pw, Scales + scale_at + s_sw, offs, mask,
                  HALF, BLOCK_HALF, FORMAT, FP8_MAX, INT4_GROUP)  # fmt: skip


def fused_write_supported(kv_dtype: str, head_dim: int) -> bool:
    """Whether the kernel handles this format and head dim (int4 needs D/2 = 32 * 2^k)."""
    half = head_dim // 2
    if head_dim % 2:
        return False
    return kv_dtype != "int4" or (half % INT4_GROUP == 0 and half & (half - 1) == 0)


def rope_kv_write_triton(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    pages: KVPages,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_dtype: torch.dtype,
) -> torch.Tensor:
    """Rotate the query heads of ``qkv`` ``[T, (Hq + 2 Hkv) * D]`` into a new ``[T, Hq, D]``
    tensor of ``q_dtype``, and write rotated K and V into ``pages`` at ``slots``.

    ``cos``/``sin`` are the ``[max_position, D]`` rotate-half tables (both halves equal).
    """
    tokens = qkv.shape[0]
    if qkv.stride(-1) != 1 or qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError("qkv must be [T, (Hq + 2 Hkv) * D], contiguous along its last dimension")
    if not fused_write_supported(pages.kv_dtype, head_dim):
        raise ValueError(f"no fused RoPE + KV write for {pages.kv_dtype} at head_dim {head_dim}")
    q = torch.empty(tokens, num_q_heads, head_dim, dtype=q_dtype, device=qkv.device)
    data = kernel_view(pages.data)
    scales = pages.scales if pages.scales is not None else data
    s = scales.stride() if pages.scales is not None else (0, 0, 0, 0)
    half = head_dim // 2
    code = FORMAT_CODES[pages.kv_dtype]
    _rope_kv_kernel[(tokens, num_q_heads + num_kv_heads)](
        qkv, positions, cos, sin, slots, q, data, scales,
        qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1),
        data.stride(0), data.stride(1), data.stride(2), data.stride(3), *s[:4],
        NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        PAGE_SIZE=pages.page_size, PAYLOAD_DIM=data.shape[-1], FORMAT=code,
        FP8_MAX=_FP8_MAX.get(code, 0.0), INT4_GROUP=INT4_GROUP,
    )  # fmt: skip
    return q
