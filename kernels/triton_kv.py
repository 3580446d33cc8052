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
def load_kv_tile(
    ptr,
    scale_ptr,
    rows,
    scale_rows,
    in_seq,
    FORMAT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    INT4_GROUP: tl.constexpr,
):
    """A ``[BLOCK_N, HEAD_DIM]`` tile of the head vectors starting at ``rows``.

    Float formats come back in their stored dtype (the caller casts once, to
    its dot dtype); the others come back dequantized in fp32. Tokens outside
    ``in_seq`` read as zeros, so they add nothing through V.
    """
    if FORMAT == 4:
        # Whole bytes load as contiguous vectors; nibbles are split and
        # interleaved back in registers (element 2j low, 2j+1 high).
        offs_b = tl.arange(0, HEAD_DIM // 2)
        packed = tl.load(ptr + rows[:, None] + offs_b[None, :], mask=in_seq[:, None], other=0)
        packed = packed.to(tl.int32)
        nibbles = tl.join(packed & 0xF, packed >> 4).to(tl.float32)
        groups = tl.reshape(nibbles, (rows.shape[0], HEAD_DIM // INT4_GROUP, INT4_GROUP))
        offs_g = 2 * tl.arange(0, HEAD_DIM // INT4_GROUP)
        scale_at = scale_ptr + scale_rows[:, None] + offs_g[None, :]
        scale = tl.load(scale_at, mask=in_seq[:, None], other=0).to(tl.float32)
        low = tl.load(scale_at + 1, mask=in_seq[:, None], other=0).to(tl.float32)
        groups = groups * scale[:, :, None] + low[:, :, None]
        x = tl.reshape(groups, (rows.shape[0], HEAD_DIM))
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        x = tl.load(ptr + rows[:, None] + offs_d[None, :], mask=in_seq[:, None], other=0)
        if FORMAT == 1:
            x = x.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        if FORMAT == 2:
            x = x.to(tl.float8e5, bitcast=True).to(tl.float32)
        if FORMAT == 3:
            scale = tl.load(scale_ptr + scale_rows, mask=in_seq, other=0).to(tl.float32)
            x = x.to(tl.float32) * scale[:, None]
    # One return: the compiler types every return statement, constexpr branches or not.
    return x


@triton.jit
def softmax_accumulate(acc, m_i, l_i, qk, v, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """Fold one tile of base-2 scores ``qk [M, N]`` and values ``v [N, D]`` in.

    ``m_i`` starts finite (not -inf) so a fully masked row keeps alpha = 1 and
    p = 0 instead of computing inf - inf.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
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
