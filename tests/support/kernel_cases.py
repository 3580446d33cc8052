"""Random ragged batches for the kernel tests, and the error measures they assert on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscope.kernels.kv_quant import KVPages
from kvscope.kernels.metadata import AttentionMetadata


@dataclass
class PagedBatch:
    q: torch.Tensor  # [total_q, Hq, D]
    pages: KVPages  # what the kernels read (quantized)
    meta: AttentionMetadata
    k: torch.Tensor  # [total_k, Hkv, D] fp32: the K/V before quantization
    v: torch.Tensor
    cu_seqlens_k: torch.Tensor


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def paged_batch(
    query_lens: list[int],
    kv_lens: list[int],
    *,
    page_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype: str,
    q_dtype: torch.dtype,
) -> PagedBatch:
    """Requests on shuffled pages of a pool with spare pages, every slot holding junk first.

    Junk (finite, large) in the spare pages and in the unused tail of each last
    page makes a kernel that reads past a sequence or through a wrong page id fail.
    """
    need = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(need) + 3
    pages = KVPages.allocate(num_pages, page_size, num_kv_heads, head_dim, kv_dtype)
    all_slots = torch.arange(num_pages * page_size)
    junk = torch.randn(2, len(all_slots), num_kv_heads, head_dim) * 8
    pages.write(all_slots, junk[0], junk[1])
    order = torch.randperm(num_pages).tolist()
    tables = [[order.pop() for _ in range(n)] for n in need]
    total_k = sum(kv_lens)
    k = torch.randn(total_k, num_kv_heads, head_dim)
    v = torch.randn(total_k, num_kv_heads, head_dim)
    slots = torch.tensor(
        [
            table[i // page_size] * page_size + i % page_size
            for table, n in zip(tables, kv_lens, strict=True)
            for i in range(n)
        ]
    )
    pages.write(slots, k, v)
    q = torch.randn(sum(query_lens), num_q_heads, head_dim).to(q_dtype)
    meta = AttentionMetadata.build(tables, query_lens, kv_lens, page_size)
    return PagedBatch(q, pages, meta, k, v, cu_seqlens(kv_lens))


def poisoned(like: torch.Tensor) -> torch.Tensor:
    """An output buffer of NaNs: any element a kernel fails to write fails the test."""
    return torch.full_like(like, float("nan"))


def max_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|; NaN anywhere in ``out`` gives NaN."""
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def norm_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()
