"""Plain torch reference attention: materialized scores, every step visible.

This is what the kernels are tested against (in float64): no tiling, no
online softmax, no SDPA, only ``softmax(q k^T * scale + mask) v`` per request,
with paged K/V first dequantized and laid out contiguously.
"""

from __future__ import annotations

import torch

from kvscope.kernels.kv_quant import dequantize, infer_format


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = True,
    sm_scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Ragged attention in ``dtype``; causal masks are bottom-right aligned.

    A query that sees no key (causal, fewer keys than queries) outputs zeros.
    """
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        qi = q[cu_q[i] : cu_q[i + 1]].to(dtype).transpose(0, 1)  # [Hq, q_len, D]
        ki = k[cu_k[i] : cu_k[i + 1]].to(dtype).repeat_interleave(group, dim=1).transpose(0, 1)
        vi = v[cu_k[i] : cu_k[i + 1]].to(dtype).repeat_interleave(group, dim=1).transpose(0, 1)
        q_len, kv_len = qi.shape[1], ki.shape[1]
        scores = qi @ ki.transpose(1, 2) * scale
        if causal:
            query_pos = torch.arange(q_len, device=q.device)[:, None] + kv_len - q_len
            visible = torch.arange(kv_len, device=q.device)[None, :] <= query_pos
            scores = scores.masked_fill(~visible, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[cu_q[i] : cu_q[i + 1]] = (weights @ vi).transpose(0, 1)
    return out


def gather_sequences(
    kv: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dequantized pages ``[P, 2, ps, Hkv, D]`` to contiguous ``k``, ``v`` and ``cu_seqlens_k``."""
    page_size = kv.shape[2]
    indptr, last = kv_indptr.tolist(), kv_last_page_len.tolist()
    ks, vs, cu_k = [], [], [0]
    for i in range(len(last)):
        pages = kv[kv_indices[indptr[i] : indptr[i + 1]].long()]
        kv_len = (indptr[i + 1] - indptr[i] - 1) * page_size + last[i]
        ks.append(pages[:, 0].flatten(0, 1)[:kv_len])
        vs.append(pages[:, 1].flatten(0, 1)[:kv_len])
        cu_k.append(cu_k[-1] + kv_len)
    return torch.cat(ks), torch.cat(vs), torch.tensor(cu_k, dtype=torch.int32)


def paged_attention_reference(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    sm_scale: float | None = None,
    kv_dtype: str | None = None,
    scales: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Causal attention of ragged new tokens over their (dequantized) paged K/V."""
    kv = dequantize(kv_pages, scales, infer_format(kv_pages, kv_dtype), dtype)
    k, v, cu_seqlens_k = gather_sequences(kv, kv_indptr, kv_indices, kv_last_page_len)
    return attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, True, sm_scale, dtype)
