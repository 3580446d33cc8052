"""The KV tensors: one page pool per layer, ``[num_pages, 2, page_size, Hkv, D]`` (NHD).

New tokens' K and V are written through a slot mapping (slot = page *
page_size + offset), the layout FlashInfer and vLLM use, so any kernel that
reads the CSR page table can read these pages.
"""

from __future__ import annotations

import torch


class KVStorage:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.page_size = page_size
        self.pages = torch.zeros(num_layers, num_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.pages.numel() * self.pages.element_size()

    def layer(self, i: int) -> torch.Tensor:
        return self.pages[i]

    def write(self, layer: int, page_idx: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kv = self.pages[layer]
        kv[page_idx, 0, offsets] = k.to(kv.dtype)
        kv[page_idx, 1, offsets] = v.to(kv.dtype)

    def copy_page(self, src: int, dst: int) -> None:
        self.pages[:, dst] = self.pages[:, src]
