"""FlashAttention-2 style varlen prefill in Triton, over contiguous or paged K/V.

One program owns ``BLOCK_M`` queries of one head of one request (grid: query
blocks x query heads x requests, so a ragged batch needs no padding) and
streams that request's K/V in ``BLOCK_N`` tiles, keeping the running max and
sum in registers and normalizing once at the end. Queries are the *last*
tokens of their sequence (bottom-right causal alignment), which is what a
cached prefix or a chunked prefill needs: with ``PAGED`` the kernel reads the
whole sequence, cached prefix and new tokens alike, through the page table.
Key tiles entirely below the diagonal run without masks; tiles above it are
never visited. Several query heads share one KV head (GQA) by index only.
A head dim that is not a power of two runs in tiles padded to the next one,
the padding masked off on every load and store. Tile sizes, warps and stages
are autotuned per device (``kernels/launch_configs.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvscope.kernels.kv_quant import INT4_GROUP
from kvscope.kernels.launch_configs import (
    check_head_dim,
    length_class,
    padded_head_dim,
    prefill_autotune,
)
from kvscope.kernels.triton_kv import (
    FORMAT_CODES,
    dot_config,
    kernel_view,
    key_scores,
    load_kv_tile,
    paged_kv_len,
    paged_rows,
    scale_views,
    softmax_accumulate,
    tile_mask,
)


@triton.jit
def _attend_range(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    K,
    V,
    KS,
    VS,
    kv_indices,
    first_page,
    k_start,
    kv_len,
    kv_head,
    lo,
    hi,
    qk_scale,
    s_kp,
    s_kt,
    s_kh,
    s_sp,
    s_st,
    s_sh,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    FORMAT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INT4_GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    for n0 in range(lo, hi, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        in_seq = tok < kv_len
        if PAGED:
            rows, scale_rows = paged_rows(
                kv_indices, first_page, tok, in_seq, kv_head,
                s_kp, s_kt, s_kh, s_sp, s_st, s_sh, PAGE_SIZE,
            )  # fmt: skip
        else:
            rows = (k_start + tok).to(tl.int64) * s_kt + kv_head * s_kh
            scale_rows = rows
        qk = key_scores(
            q, K, KS, rows, scale_rows, in_seq, qk_scale,
            FORMAT, HEAD_DIM, BLOCK_D, INT4_GROUP, DOT_DTYPE, PRECISION,
        )  # fmt: skip
        if MASKED:
            visible = in_seq[None, :]
            if CAUSAL:
                visible = visible & (tok[None, :] <= q_pos[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        v = load_kv_tile(
            V, VS, rows, scale_rows, in_seq, FORMAT, HEAD_DIM, BLOCK_D, INT4_GROUP, DOT_DTYPE, True
        )
        acc, m_i, l_i = softmax_accumulate(acc, m_i, l_i, qk, v, DOT_DTYPE, PRECISION)
    return acc, m_i, l_i


@prefill_autotune
@triton.jit(do_not_specialize=["q_class"])
def _prefill_kernel(
    Q,
    K,
    V,
    KS,
    VS,
    Out,
    cu_seqlens_q,
    cu_seqlens_k,
    kv_indptr,
    kv_indices,
    kv_last_page_len,
    qk_scale,
    q_class,
    s_qt,
    s_qh,
    s_ot,
    s_oh,
    s_kp,
    s_kt,
    s_kh,
    s_sp,
    s_st,
    s_sh,
    GROUP: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    FORMAT: tl.constexpr,
    INT4_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    m_block = tl.program_id(0)
    head = tl.program_id(1)
    req = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q + req)
    q_len = tl.load(cu_seqlens_q + req + 1) - q_start
    m0 = m_block * BLOCK_M
    if m0 >= q_len:
        return
    if PAGED:
        first_page, kv_len = paged_kv_len(kv_indptr, kv_last_page_len, req, PAGE_SIZE)
        k_start = 0
    else:
        first_page = 0
        k_start = tl.load(cu_seqlens_k + req)
        kv_len = tl.load(cu_seqlens_k + req + 1) - k_start
    kv_head = head // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_rows = (q_start + offs_m).to(tl.int64)
    q_mask = tile_mask(offs_m < q_len, offs_d, HEAD_DIM, BLOCK_D)
    q = tl.load(Q + q_rows[:, None] * s_qt + head * s_qh + offs_d[None, :], mask=q_mask, other=0)
    q = q.to(tl.float32).to(DOT_DTYPE)
    # Query i sits at position kv_len - q_len + i of its sequence.
    q_pos = kv_len - q_len + offs_m

    if CAUSAL:
        # Tiles wholly at or left of the block's first query need no mask.
        lo = tl.maximum(kv_len - q_len + m0 + 1, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(kv_len, kv_len - q_len + m0 + BLOCK_M)
    else:
        lo = kv_len // BLOCK_N * BLOCK_N
        hi = kv_len

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, q_pos, K, V, KS, VS, kv_indices, first_page, k_start, kv_len,
        kv_head, 0, lo, qk_scale, s_kp, s_kt, s_kh, s_sp, s_st, s_sh,
        False, CAUSAL, PAGED, PAGE_SIZE, FORMAT, HEAD_DIM, BLOCK_D, INT4_GROUP, BLOCK_N, DOT_DTYPE,
        PRECISION,
    )  # fmt: skip
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, q_pos, K, V, KS, VS, kv_indices, first_page, k_start, kv_len,
        kv_head, lo, hi, qk_scale, s_kp, s_kt, s_kh, s_sp, s_st, s_sh,
        True, CAUSAL, PAGED, PAGE_SIZE, FORMAT, HEAD_DIM, BLOCK_D, INT4_GROUP, BLOCK_N, DOT_DTYPE,
        PRECISION,
    )  # fmt: skip
    # A query with no visible key (causal, fewer keys than queries) outputs zeros.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = Out + q_rows[:, None] * s_ot + head * s_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=q_mask)


def _check(q: torch.Tensor, num_kv_heads: int, out: torch.Tensor | None) -> torch.Tensor:
    check_head_dim(q.shape[-1])
    if q.shape[1] % num_kv_heads:
        raise ValueError(f"{q.shape[1]} query heads do not group over {num_kv_heads} KV heads")
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous along head_dim")
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be shaped {tuple(q.shape)} and contiguous along head_dim")
    return out


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    index_args: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    kv_strides: tuple[int, int, int],
    scale_strides: tuple[int, int, int],
    *,
    causal: bool,
    paged: bool,
    page_size: int,
    kv_dtype: str,
    sm_scale: float,
) -> torch.Tensor:
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[-2]
    dot_dtype, precision = dot_config(q.dtype)

    def grid(config: dict) -> tuple[int, int, int]:
        return triton.cdiv(max_seqlen_q, config["BLOCK_M"]), num_q_heads, cu_seqlens_q.numel() - 1

    _prefill_kernel[grid](
        q, k, v, k_scales, v_scales, out, cu_seqlens_q, *index_args,
        sm_scale * 1.4426950408889634, length_class(max_seqlen_q),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *kv_strides, *scale_strides,
        GROUP=num_q_heads // num_kv_heads,
        CAUSAL=causal,
        PAGED=paged,
        PAGE_SIZE=page_size,
        FORMAT=FORMAT_CODES[kv_dtype],
        INT4_GROUP=INT4_GROUP,
        HEAD_DIM=head_dim,
        BLOCK_D=padded_head_dim(head_dim),
        DOT_DTYPE=dot_dtype,
        PRECISION=precision,
    )  # fmt: skip
    return out


def varlen_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    *,
    causal: bool,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ragged attention over contiguous K/V ``[total_k, Hkv, D]``."""
    out = _check(q, k.shape[1], out)
    if k.stride() != v.stride() or k.stride(-1) != 1:
        raise ValueError("k and v must share strides and be contiguous along head_dim")
    return _launch(
        q, k, v, k, v, out, cu_seqlens_q, max_seqlen_q,
        (cu_seqlens_k, cu_seqlens_k, cu_seqlens_k, cu_seqlens_k),
        (0, k.stride(0), k.stride(1)), (0, 0, 0),
        causal=causal, paged=False, page_size=1, kv_dtype="fp32", sm_scale=sm_scale,
    )  # fmt: skip


def paged_prefill_triton(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    max_seqlen_q: int,
    *,
    kv_dtype: str,
    scales: torch.Tensor | None,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ragged new tokens over their whole paged sequence."""
    out = _check(q, kv_pages.shape[3], out)
    if kv_pages.stride(-1) != 1:
        raise ValueError("kv_pages must be contiguous along head_dim")
    pages = kernel_view(kv_pages)
    k_scales, v_scales, scale_strides = scale_views(pages, scales)
    return _launch(
        q, pages[:, 0], pages[:, 1], k_scales, v_scales, out, cu_seqlens_q, max_seqlen_q,
        (cu_seqlens_q, kv_indptr, kv_indices, kv_last_page_len),
        (pages.stride(0), pages.stride(2), pages.stride(3)), scale_strides,
        causal=True, paged=True, page_size=kv_pages.shape[2], kv_dtype=kv_dtype,
        sm_scale=sm_scale,
    )  # fmt: skip
