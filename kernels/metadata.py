"""The per-step description of a ragged, paged attention batch.

The engine builds one ``AttentionMetadata`` per step and every layer reuses it.
The page table is FlashInfer's CSR layout: request ``i`` owns pages
``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`` and its last page holds
``kv_last_page_len[i]`` tokens (1..page_size). The new tokens of request ``i``
are ``q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]]``; they are the *last* tokens of
its sequence (its K/V already written into the pages), so causal masking is
bottom-right aligned, as after a cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor  # int32 [B+1]
    kv_indptr: torch.Tensor  # int32 [B+1]
    kv_indices: torch.Tensor  # int32 [nnz_pages]
    kv_last_page_len: torch.Tensor  # int32 [B]
    page_size: int
    query_lens: list[int]  # host copy of cu_seqlens_q diffs
    kv_lens: list[int]  # host copy: tokens in cache per request, new ones included
    # Per-backend derived tensors (gather indices, masks) computed once per
    # step and shared by all layers.
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.query_lens)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens)

    @classmethod
    def build(
        cls,
        page_tables: list[list[int]],
        query_lens: list[int],
        kv_lens: list[int],
        page_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Build the CSR page table from per-request page lists."""
        indptr = [0]
        flat: list[int] = []
        last = []
        for pages, n in zip(page_tables, kv_lens, strict=True):
            used = (n + page_size - 1) // page_size
            assert used <= len(pages), "request holds fewer pages than its tokens need"
            flat.extend(pages[:used])
            indptr.append(len(flat))
            last.append(n - (used - 1) * page_size)
        cu = [0]
        for n in query_lens:
            cu.append(cu[-1] + n)

        def i32(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        return cls(
            cu_seqlens_q=i32(cu),
            kv_indptr=i32(indptr),
            kv_indices=i32(flat),
            kv_last_page_len=i32(last),
            page_size=page_size,
            query_lens=list(query_lens),
            kv_lens=list(kv_lens),
        )

    @classmethod
    def from_csr(
        cls,
        cu_seqlens_q: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        page_size: int,
    ) -> AttentionMetadata:
        """Wrap an existing CSR page table, deriving the host-side lengths from it."""
        pages = kv_indptr.diff().tolist()
        last = kv_last_page_len.tolist()
        return cls(
            cu_seqlens_q=cu_seqlens_q,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            kv_last_page_len=kv_last_page_len,
            page_size=page_size,
            query_lens=cu_seqlens_q.diff().tolist(),
            kv_lens=[(p - 1) * page_size + n for p, n in zip(pages, last, strict=True)],
        )
