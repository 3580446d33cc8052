"""Split-K paged decode attention in Triton (flash-decoding).

Decode is bound by reading the KV cache, so the kernel is organised around
reads: one program takes one KV head of one request and all the query heads
of its GQA group together (padded to 16 rows for ``tl.dot``), so every K/V
tile is read once per group instead of once per query head. Long contexts are
cut into ``num_splits`` token ranges run in parallel; each writes a partial
output and its log-sum-exp, and a second kernel merges them. Pages are read
through the CSR page table and dequantized in registers. Head dims pad to a
power-of-two tile as in prefill; the key tile length, warps and stages are
autotuned per device (``kernels/launch_configs.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvscope.kernels.kv_quant import INT4_GROUP
from kvscope.kernels.launch_configs import (
    DECODE_SPLIT_ALIGN,
    check_head_dim,
    decode_autotune,
    length_class,
    padded_head_dim,
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

# A split shorter than this costs more in the merge than it gains in parallelism.
_MIN_SPLIT_TOKENS = 256
_MAX_SPLITS = 64


@triton.jit
def _split_length(kv_len, num_splits, SPLIT_ALIGN: tl.constexpr):
    """Tokens per split, a whole number of tiles of any BLOCK_N; both kernels must agree on it."""
    return tl.cdiv(tl.cdiv(kv_len, num_splits), SPLIT_ALIGN) * SPLIT_ALIGN


@decode_autotune
@triton.jit(do_not_specialize=["split_class"])
def _decode_split_kernel(
    Q,
    K,
    V,
    KS,
    VS,
    kv_indptr,
    kv_indices,
    kv_last_page_len,
    O_part,
    L_part,
    qk_scale,
    num_splits,
    split_class,
    s_qb,
    s_qh,
    s_kp,
    s_kt,
    s_kh,
    s_sp,
    s_st,
    s_sh,
    s_ob,
    s_oh,
    s_os,
    s_lb,
    s_lh,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    FORMAT: tl.constexpr,
    INT4_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    first_page, kv_len = paged_kv_len(kv_indptr, kv_last_page_len, req, PAGE_SIZE)
    split_len = _split_length(kv_len, num_splits, SPLIT_ALIGN)
    start = split * split_len
    if start >= kv_len:
        return
    end = tl.minimum(start + split_len, kv_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    head_ok = tile_mask(offs_h < GROUP, offs_d, HEAD_DIM, BLOCK_D)
    heads = kv_head * GROUP + offs_h
    q = tl.load(Q + req * s_qb + heads[:, None] * s_qh + offs_d[None, :], mask=head_ok, other=0)
    q = q.to(tl.float32).to(DOT_DTYPE)

    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        in_seq = tok < end
        rows, scale_rows = paged_rows(
            kv_indices, first_page, tok, in_seq, kv_head,
            s_kp, s_kt, s_kh, s_sp, s_st, s_sh, PAGE_SIZE,
        )  # fmt: skip
        qk = key_scores(
            q, K, KS, rows, scale_rows, in_seq, qk_scale,
            FORMAT, HEAD_DIM, BLOCK_D, INT4_GROUP, DOT_DTYPE, PRECISION,
        )  # fmt: skip
        qk = tl.where(in_seq[None, :], qk, float("-inf"))
        v = load_kv_tile(
            V, VS, rows, scale_rows, in_seq, FORMAT, HEAD_DIM, BLOCK_D, INT4_GROUP, DOT_DTYPE, True
        )
        acc, m_i, l_i = softmax_accumulate(acc, m_i, l_i, qk, v, DOT_DTYPE, PRECISION)

    # Every split holds at least one token, so l_i > 0.
    o_ptrs = O_part + req * s_ob + heads[:, None] * s_oh + split * s_os + offs_d[None, :]
    tl.store(o_ptrs, acc / l_i[:, None], mask=head_ok)
    l_ptrs = L_part + req * s_lb + heads * s_lh + split
    tl.store(l_ptrs, m_i + tl.log2(l_i), mask=offs_h < GROUP)


@triton.jit
def _decode_merge_kernel(
    O_part,
    L_part,
    Out,
    kv_indptr,
    kv_last_page_len,
    num_splits,
    s_ob,
    s_oh,
    s_os,
    s_lb,
    s_lh,
    s_outb,
    s_outh,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    _, kv_len = paged_kv_len(kv_indptr, kv_last_page_len, req, PAGE_SIZE)
    split_len = _split_length(kv_len, num_splits, SPLIT_ALIGN)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    # Splits past the end of a short sequence were never written.
    live = (offs_s < num_splits) & (offs_s * split_len < kv_len)
    lse = tl.load(L_part + req * s_lb + head * s_lh + offs_s, mask=live, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))
    o_ptrs = O_part + req * s_ob + head * s_oh + offs_s[:, None] * s_os + offs_d[None, :]
    parts = tl.load(o_ptrs, mask=tile_mask(live, offs_d, HEAD_DIM, BLOCK_D), other=0)
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    out_ptrs = Out + req * s_outb + head * s_outh + offs_d
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)


def _device_parallelism(device: torch.device) -> int:
    """Programs worth having in flight: four per SM on a GPU, so each SM keeps
    several independent K/V streams waiting on memory at once."""
    if device.type == "cuda":
        return 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def choose_num_splits(batch: int, num_kv_heads: int, max_kv_len: int, device: torch.device) -> int:
    """Enough splits to fill the device, none shorter than ``_MIN_SPLIT_TOKENS``."""
    want = triton.cdiv(_device_parallelism(device), batch * num_kv_heads)
    longest = triton.cdiv(max_kv_len, _MIN_SPLIT_TOKENS)
    return max(1, min(want, longest, _MAX_SPLITS))


def paged_decode_triton(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    *,
    kv_dtype: str,
    scales: torch.Tensor | None,
    sm_scale: float,
    max_kv_len: int,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per request attending over its paged K/V; returns ``[B, Hq, D]``."""
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = kv_pages.shape[2], kv_pages.shape[3]
    check_head_dim(head_dim)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads do not group over {num_kv_heads} KV heads")
    if q.stride(-1) != 1 or kv_pages.stride(-1) != 1:
        raise ValueError("q and kv_pages must be contiguous along head_dim")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be shaped {tuple(q.shape)} and contiguous along head_dim")
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, max_kv_len, q.device)
    group = num_q_heads // num_kv_heads
    block_d = padded_head_dim(head_dim)

    pages = kernel_view(kv_pages)
    k_scales, v_scales, scale_strides = scale_views(pages, scales)
    o_part = torch.empty(batch, num_q_heads, num_splits, head_dim, device=q.device)
    l_part = torch.empty(batch, num_q_heads, num_splits, device=q.device)
    dot_dtype, precision = dot_config(q.dtype)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, pages[:, 0], pages[:, 1], k_scales, v_scales,
        kv_indptr, kv_indices, kv_last_page_len, o_part, l_part,
        sm_scale * 1.4426950408889634, num_splits,
        length_class(triton.cdiv(max_kv_len, num_splits)),
        q.stride(0), q.stride(1),
        pages.stride(0), pages.stride(2), pages.stride(3), *scale_strides,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        l_part.stride(0), l_part.stride(1),
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        PAGE_SIZE=page_size,
        FORMAT=FORMAT_CODES[kv_dtype],
        INT4_GROUP=INT4_GROUP,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        SPLIT_ALIGN=DECODE_SPLIT_ALIGN,
        DOT_DTYPE=dot_dtype,
        PRECISION=precision,
    )  # fmt: skip
    _decode_merge_kernel[(batch, num_q_heads)](
        o_part, l_part, out, kv_indptr, kv_last_page_len, num_splits,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        l_part.stride(0), l_part.stride(1),
        out.stride(0), out.stride(1),
        PAGE_SIZE=page_size,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        SPLIT_ALIGN=DECODE_SPLIT_ALIGN,
        BLOCK_S=triton.next_power_of_2(num_splits),
    )  # fmt: skip
    return out
