"""Triton device functions shared by the prefill and decode kernels.

Both kernels walk a request's tokens through the FlashInfer-style page table,
dequantize K/V tiles in registers (``kernels/kv_quant.py`` documents the
layouts) and fold each tile into an online softmax. Keeping those three steps
here means one implementation of each storage format serves both kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# How the kernels decode a loaded K/V tile (a constexpr per launch).
FORMAT_CODES: dict[str, int] = {
    "fp32": 0,
    "fp16": 0,
    "bf16": 0,
    "fp8_e4m3": 1,
    "fp8_e5m2": 2,
    "int8": 3,
    "int4": 4,
}
# Kernels receive fp8 pages as raw bytes and bitcast them in registers: the
# interpreter has no numpy float8 type to hand a float8 tensor over as.
_RAW_BYTES = {torch.float8_e4m3fn, torch.float8_e5m2}


@triton.jit
def paged_kv_len(kv_indptr, kv_last_page_len, req, PAGE_SIZE: tl.constexpr):
    """First page slot in ``kv_indices`` and token count of request ``req``."""
    first_page = tl.load(kv_indptr + req)
    num_pages = tl.load(kv_indptr + req + 1) - first_page
    return first_page, (num_pages - 1) * PAGE_SIZE + tl.load(kv_last_page_len + req)


@triton.jit
def paged_rows(
    kv_indices,
    first_page,
    tok,
    in_seq,
    kv_head,
    s_page,
    s_tok,
    s_head,
    ss_page,
    ss_tok,
    ss_head,
    PAGE_SIZE: tl.constexpr,
):
    """Element offsets of token ``tok``'s head vector in the payload and in the scales."""
    page = tl.load(kv_indices + first_page + tok // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)
    offset = tok % PAGE_SIZE
    rows = page * s_page + offset * s_tok + kv_head * s_head
    scale_rows = page * ss_page + offset * ss_tok + kv_head * ss_head
    return rows, scale_rows


@triton.jit
def tile_mask(rows_ok, offs, LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    """Mask of a ``[rows, BLOCK]`` tile whose columns past ``LIMIT`` are padding.

    Head dims that are not a power of two run in a tile padded to the next
    one (as FlashAttention does); a power of two keeps the row mask alone.
    """
    if LIMIT == BLOCK:
        mask = rows_ok[:, None]
    else:
        mask = rows_ok[:, None] & (offs < LIMIT)[None, :]
    return mask


@triton.jit
def load_kv_tile(
    ptr,
    scale_ptr,
    rows,
    scale_rows,
    in_seq,
    FORMAT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INT4_GROUP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    SCALED: tl.constexpr,
):
    """A ``[BLOCK_N, BLOCK_D]`` tile of the head vectors starting at ``rows``, in ``DOT_DTYPE``.

    Tokens outside ``in_seq`` and columns past ``HEAD_DIM`` read as zeros, so
    they add nothing to a dot product. fp8 converts straight to the dot dtype
    (every fp8 value is exact in fp16, bf16 and fp32: one conversion, not two).
    int8 without ``SCALED`` comes back as its integer codes (exact in every
    dot dtype) for the caller to scale the dot product instead of each element.
    """
    if FORMAT == 4:
        # Whole bytes load as contiguous vectors; nibbles are split and
        # interleaved back in registers (element 2j low, 2j+1 high).
        offs_b = tl.arange(0, BLOCK_D // 2)
        byte_mask = tile_mask(in_seq, offs_b, HEAD_DIM // 2, BLOCK_D // 2)
        packed = tl.load(ptr + rows[:, None] + offs_b[None, :], mask=byte_mask, other=0)
        packed = packed.to(tl.int32)
        nibbles = tl.join(packed & 0xF, packed >> 4).to(tl.float32)
        groups = tl.reshape(nibbles, (rows.shape[0], BLOCK_D // INT4_GROUP, INT4_GROUP))
        # Each group's (scale, minimum) pair is contiguous: one load, split in registers.
        offs_g = tl.arange(0, BLOCK_D // INT4_GROUP)
        group_mask = tile_mask(in_seq, offs_g, HEAD_DIM // INT4_GROUP, BLOCK_D // INT4_GROUP)
        pair_at = (
            scale_ptr
            + scale_rows[:, None, None]
            + 2 * offs_g[None, :, None]
            + tl.arange(0, 2)[None, None, :]
        )
        pair = tl.load(pair_at, mask=group_mask[:, :, None], other=0).to(tl.float32)
        scale, low = tl.split(pair)
        groups = groups * scale[:, :, None] + low[:, :, None]
        x = tl.reshape(groups, (rows.shape[0], BLOCK_D)).to(DOT_DTYPE)
    else:
        offs_d = tl.arange(0, BLOCK_D)
        mask = tile_mask(in_seq, offs_d, HEAD_DIM, BLOCK_D)
        x = tl.load(ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0)
        if FORMAT == 0:
            x = x.to(DOT_DTYPE)
        if FORMAT == 1:
            x = x.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
        if FORMAT == 2:
            x = x.to(tl.float8e5, bitcast=True).to(DOT_DTYPE)
        if FORMAT == 3:
            if SCALED:
                scale = tl.load(scale_ptr + scale_rows, mask=in_seq, other=0).to(tl.float32)
                x = (x.to(tl.float32) * scale[:, None]).to(DOT_DTYPE)
            else:
                x = x.to(DOT_DTYPE)
    # One return: the compiler types every return statement, constexpr branches or not.
    return x


@triton.jit
def key_scores(
    q,
    K,
    KS,
    rows,
    scale_rows,
    in_seq,
    qk_scale,
    FORMAT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INT4_GROUP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Base-2 scores ``q k^T * qk_scale`` of one key tile, ``[M, BLOCK_N]`` fp32.

    int8 keys enter the dot as integer codes and their per-token scale
    multiplies the scores: q . (s k) = s (q . k), BLOCK_N multiplies per tile
    instead of BLOCK_N x BLOCK_D, and no rounding of s k to the dot dtype.
    """
    k = load_kv_tile(
        K, KS, rows, scale_rows, in_seq, FORMAT, HEAD_DIM, BLOCK_D, INT4_GROUP, DOT_DTYPE, False
    )
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if FORMAT == 3:
        k_scale = tl.load(KS + scale_rows, mask=in_seq, other=0).to(tl.float32)
        qk = qk * (k_scale * qk_scale)[None, :]
    else:
        qk = qk * qk_scale
    return qk


@triton.jit
def softmax_accumulate(acc, m_i, l_i, qk, v, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """Fold one tile of base-2 scores ``qk [M, N]`` and values ``v [N, D]`` (dot dtype) in.

    ``m_i`` starts finite (not -inf) so a fully masked row keeps alpha = 1 and
    p = 0 instead of computing inf - inf.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
    return acc, m_new, l_i


def interpreting() -> bool:
    """Whether this process's kernels run in Triton's CPU interpreter.

    Decided when triton decorated them (``TRITON_INTERPRET=1`` set before
    import), so the decorated object is the truth, not today's environment.
    """
    return isinstance(paged_kv_len, InterpretedFunction)


def dot_config(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """Operand dtype and precision of the kernels' ``tl.dot`` for queries of ``dtype``.

    fp16/bf16 multiply in their own type on tensor cores. fp32 uses "tf32x3"
    (three TF32 products, near-fp32 accuracy, still on tensor cores): exact
    fp32 FMA dots at these tile sizes spill registers heavily on sm_90. The
    interpreter computes bf16 products wrongly, so there bf16 goes through
    fp32, which represents every bf16 value exactly (it ignores the precision).
    """
    if dtype == torch.float16:
        return tl.float16, "tf32"
    if dtype == torch.bfloat16 and not interpreting():
        return tl.bfloat16, "tf32"
    return tl.float32, "tf32x3"


def kernel_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the kernels can take it (fp8 as raw bytes)."""
    return t.view(torch.uint8) if t.dtype in _RAW_BYTES else t


def scale_views(
    kv_pages: torch.Tensor, scales: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """K and V scale views and their (page, token, head) strides.

    Formats without scales pass the pages themselves; the kernels never read them.
    """
    if scales is None:
        return kv_pages, kv_pages, (0, 0, 0)
    if scales.dim() == 6 and scales.stride()[-2:] != (2, 1):
        raise ValueError("int4 scales must keep (scale, min) pairs contiguous per group")
    return scales[:, 0], scales[:, 1], (scales.stride(0), scales.stride(2), scales.stride(3))
