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

from kvscope.kernels.kv_quant import dequantize, infer_format
from kvscope.kernels.metadata import AttentionMetadata
from kvscope.kernels.torch_sdpa import sdpa_one


def _decode_gather_index(
    meta: AttentionMetadata, rows: list[int]
) -> tuple[torch.Tensor, torch.Tensor | int]:
    """Padded page ids [B * max_pages] and key mask [B, 1, 1, max_pages * page_size], or
    instead of the mask the one length every request has."""
    indptr = meta.kv_indptr.tolist()
    counts = [indptr[r + 1] - indptr[r] for r in rows]
    max_pages = max(counts)
    device = meta.kv_indices.device
    index = torch.zeros(len(rows), max_pages, dtype=torch.long, device=device)
    for b, r in enumerate(rows):
        index[b, : counts[b]] = meta.kv_indices[indptr[r] : indptr[r + 1]].long()
    host_lens = [meta.kv_lens[r] for r in rows]
    if len(set(host_lens)) == 1:
        # Equal lengths (batch 1 always): the keys are cut to that length instead, and
        # SDPA runs unmasked (a mask costs it two extra ops and a slower kernel).
        return index.flatten(), host_lens[0]
    lens = torch.tensor(host_lens, device=device)
    positions = torch.arange(max_pages * meta.page_size, device=device)
    mask = (positions[None, :] < lens[:, None])[:, None, None, :]
    return index.flatten(), mask


def _split_rows(meta: AttentionMetadata) -> tuple[list[int], list[int]]:
    if "rows" not in meta.cache:
        decode = [i for i, n in enumerate(meta.query_lens) if n == 1]
        prefill = [i for i, n in enumerate(meta.query_lens) if n > 1]
        meta.cache["rows"] = (decode, prefill)
    return meta.cache["rows"]


def _gather(
    kv_pages: torch.Tensor,
    scales: torch.Tensor | None,
    kv_dtype: str,
    page_ids: torch.Tensor,
    dtype: torch.dtype,
    buffers: dict | None = None,
) -> list[torch.Tensor]:
    """K and V of pages ``page_ids``, each ``[len(page_ids) * page_size, Hkv, D]``.

    One ``index_select`` per tensor copies whole pages (memcpy-sized chunks);
    SDPA then reads K/V through a head-transposed view, which measured faster
    than gathering head-major. ``buffers`` (the step's metadata cache) lets all
    layers of a step reuse one allocation instead of paying fresh-page faults.
    """
    out = []
    for which in (0, 1):
        payload = kv_pages[:, which]  # [P, ps, Hkv, D']
        shape = (page_ids.numel(), *payload.shape[1:])
        buffer = None if buffers is None else buffers.get(("pages", which))
        if buffer is None or buffer.shape != shape or buffer.dtype != payload.dtype:
            buffer = torch.empty(shape, dtype=payload.dtype, device=payload.device)
            if buffers is not None:
                buffers[("pages", which)] = buffer
        torch.index_select(payload, 0, page_ids, out=buffer)
        picked = None if scales is None else scales[:, which][page_ids]
        out.append(dequantize(buffer, picked, kv_dtype, dtype).flatten(0, 1))
    return out


def _decode(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    scales: torch.Tensor | None,
    kv_dtype: str,
    meta: AttentionMetadata,
    rows: list[int],
    scale: float,
) -> torch.Tensor:
    if "decode_index" not in meta.cache:
        meta.cache["decode_index"] = _decode_gather_index(meta, rows)
    page_ids, mask = meta.cache["decode_index"]
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = kv_pages.shape[3]
    k, v = (
        x.view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
        for x in _gather(kv_pages, scales, kv_dtype, page_ids, q.dtype, meta.cache)
    )
    if isinstance(mask, int):  # every request holds this many tokens
        k, v, mask = k[:, :, :mask], v[:, :, :mask], None
    # The query heads of a GQA group are their KV head's query rows: no K/V repeat.
    qg = q.view(batch, num_kv_heads, -1, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(batch, num_q_heads, head_dim)


def paged_attention_torch(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    meta: AttentionMetadata,
    sm_scale: float | None = None,
    kv_dtype: str | None = None,
    scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ragged new tokens over their paged K/V.

    q: [total_q, Hq, D]; kv_pages: [num_pages, 2, page_size, Hkv, D'] (new
    tokens' K/V already written) in ``kv_dtype`` (inferred from the float
    dtypes), with ``scales`` for int8/int4. Returns [total_q, Hq, D].
    """
    kv_dtype = infer_format(kv_pages, kv_dtype)
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    decode_rows, prefill_rows = _split_rows(meta)
    if not prefill_rows:
        return _decode(q, kv_pages, scales, kv_dtype, meta, decode_rows, scale)
    out = torch.empty_like(q)
    cu = meta.cache.setdefault("cu_host", meta.cu_seqlens_q.tolist())
    if decode_rows:
        token_rows = torch.tensor([cu[r] for r in decode_rows], device=q.device)
        out[token_rows] = _decode(
            q[token_rows], kv_pages, scales, kv_dtype, meta, decode_rows, scale
        )
    indptr = meta.cache.setdefault("indptr_host", meta.kv_indptr.tolist())
    for r in prefill_rows:
        page_ids = meta.kv_indices[indptr[r] : indptr[r + 1]].long()
        k, v = _gather(kv_pages, scales, kv_dtype, page_ids, q.dtype)
        kv_len = meta.kv_lens[r]
        out[cu[r] : cu[r + 1]] = sdpa_one(q[cu[r] : cu[r + 1]], k[:kv_len], v[:kv_len], True, scale)
    return out
