"""Paged attention in plain torch: the fast CPU path the engine uses by default.

Decode requests (one new token each) are served by one batched gather of their
pages and one ``scaled_dot_product_attention`` call, with the query heads of a
GQA group laid out as that KV head's "query rows" so K/V are never repeated.
Requests with several new tokens (prefill, chunked prefill, prefill after a
prefix hit) each take one SDPA call over their own pages; there are few of
them in a step, so the loop is over prefills only, never over decodes.
Quantized pages are dequantized right after the gather, so only the pages a
step reads are ever widened.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.kv_quant import dequantize, infer_format
from kernels.metadata import AttentionMetadata
from kernels.torch_sdpa import sdpa_one


def _decode_gather_index(
    meta: AttentionMetadata, rows: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded page ids [B, max_pages] and key mask [B, 1, 1, max_pages*page_size]."""
    indptr = meta.kv_indptr.tolist()
    counts = [indptr[r + 1] - indptr[r] for r in rows]
    max_pages = max(counts)
    device = meta.kv_indices.device
    index = torch.zeros(len(rows), max_pages, dtype=torch.long, device=device)
    for b, r in enumerate(rows):
        index[b, : counts[b]] = meta.kv_indices[indptr[r] : indptr[r + 1]].long()
    lens = torch.tensor([meta.kv_lens[r] for r in rows], device=device)
    positions = torch.arange(max_pages * meta.page_size, device=device)
    mask = (positions[None, :] < lens[:, None])[:, None, None, :]
    return index, mask


def _split_rows(meta: AttentionMetadata) -> tuple[list[int], list[int]]:
    if "rows" not in meta.cache:
        decode = [i for i, n in enumerate(meta.query_lens) if n == 1]
        prefill = [i for i, n in enumerate(meta.query_lens) if n > 1]
        meta.cache["rows"] = (decode, prefill)
    return meta.cache["rows"]


def _gather(
    kv_pages: torch.Tensor,
    scales: torch.Tensor | None,
    kv_format: str,
    index: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Pages ``index`` (any shape) as ``[*index.shape, 2, ps, Hkv, D]`` of ``dtype``."""
    payload = kv_pages[index]
    return dequantize(payload, None if scales is None else scales[index], kv_format, dtype)


def _decode(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    scales: torch.Tensor | None,
    kv_format: str,
    meta: AttentionMetadata,
    rows: list[int],
    scale: float,
) -> torch.Tensor:
    if "decode_index" not in meta.cache:
        meta.cache["decode_index"] = _decode_gather_index(meta, rows)
    index, mask = meta.cache["decode_index"]
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = kv_pages.shape[2], kv_pages.shape[3]
    group = num_q_heads // num_kv_heads
    pages = _gather(kv_pages, scales, kv_format, index, q.dtype)  # [B, P, 2, ps, Hkv, D]
    seq = index.shape[1] * page_size
    k = pages[:, :, 0].reshape(batch, seq, num_kv_heads, head_dim).transpose(1, 2)
    v = pages[:, :, 1].reshape(batch, seq, num_kv_heads, head_dim).transpose(1, 2)
    qg = q.view(batch, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(batch, num_q_heads, head_dim)


def paged_attention_torch(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    meta: AttentionMetadata,
    sm_scale: float | None = None,
    kv_format: str | None = None,
    scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ragged new tokens over their paged K/V.

    q: [total_q, Hq, D]; kv_pages: [num_pages, 2, page_size, Hkv, D'] (new
    tokens' K/V already written) in ``kv_format`` (inferred from the float
    dtypes), with ``scales`` for int8/int4. Returns [total_q, Hq, D].
    """
    kv_format = infer_format(kv_pages, kv_format)
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    decode_rows, prefill_rows = _split_rows(meta)
    if not prefill_rows:
        return _decode(q, kv_pages, scales, kv_format, meta, decode_rows, scale)
    out = torch.empty_like(q)
    cu = meta.cache.setdefault("cu_host", meta.cu_seqlens_q.tolist())
    if decode_rows:
        token_rows = torch.tensor([cu[r] for r in decode_rows], device=q.device)
        out[token_rows] = _decode(
            q[token_rows], kv_pages, scales, kv_format, meta, decode_rows, scale
        )
    indptr = meta.cache.setdefault("indptr_host", meta.kv_indptr.tolist())
    num_kv_heads, head_dim = kv_pages.shape[3], q.shape[-1]
    for r in prefill_rows:
        page_ids = meta.kv_indices[indptr[r] : indptr[r + 1]].long()
        kv = _gather(kv_pages, scales, kv_format, page_ids, q.dtype)  # [P, 2, ps, Hkv, D]
        kv_len = meta.kv_lens[r]
        k = kv[:, 0].reshape(-1, num_kv_heads, head_dim)[:kv_len]
        v = kv[:, 1].reshape(-1, num_kv_heads, head_dim)[:kv_len]
        out[cu[r] : cu[r + 1]] = sdpa_one(q[cu[r] : cu[r + 1]], k, v, True, scale)
    return out
