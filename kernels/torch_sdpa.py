"""Ragged attention over contiguous K/V in plain torch: one SDPA call per request.

The torch fallback of ``flash_attention_varlen``, and the per-request step the
paged torch path uses once it has gathered a request's pages.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa_one(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> torch.Tensor:
    """q ``[q_len, Hq, D]`` over k, v ``[kv_len, Hkv, D]``, bottom-right causal.

    SDPA gets 4-D ``[1, H, L, D]`` views: with 3-D inputs torch's CPU dispatch
    falls back to its math path, measured 10x slower at 500 tokens.
    """
    q_len, kv_len = q.shape[0], k.shape[0]
    qh, k, v = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if not causal:
        out = F.scaled_dot_product_attention(qh, k, v, scale=scale, enable_gqa=True)
    elif q_len == kv_len:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # Query i sits at position kv_len - q_len + i. A row with no visible
        # key (more queries than keys) is zeroed, as the kernels do, instead
        # of SDPA's NaN.
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - q_len)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        if kv_len < q_len:
            out[..., : q_len - kv_len, :] = 0
    return out[0].transpose(0, 1)


def varlen_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal: bool,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ragged attention: q ``[total_q, Hq, D]``, k and v ``[total_k, Hkv, D]``."""
    out = torch.empty_like(q) if out is None else out
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        q_rows, k_rows = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        k_i, v_i = k[k_rows].to(q.dtype), v[k_rows].to(q.dtype)
        out[q_rows] = sdpa_one(q[q_rows], k_i, v_i, causal, sm_scale)
    return out
