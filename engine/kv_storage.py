"""The KV tensors: every layer's pages in one storage format (fp32 ... int4).

Layer ``i`` is a ``kernels.KVPages`` view: payload ``[num_pages, 2, page_size,
Hkv, D']`` (NHD) plus, for int8/int4, its scales. All layers live in one
stacked tensor (and one stacked scales tensor) so a page moves to or from the
host tier with one copy per tensor. New tokens' K/V are quantized on the way
in, through a slot mapping (slot = page * page_size + offset), the layout
FlashInfer and vLLM use.
"""

from __future__ import annotations

import torch

from kvscope.kernels import KVPages


class KVStorage:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        kv_dtype: str = "fp32",
        device: str | torch.device = "cpu",
    ) -> None:
        self.page_size = page_size
        self.kv_dtype = kv_dtype
        stacked = KVPages.allocate(
            num_layers * num_pages, page_size, num_kv_heads, head_dim, kv_dtype, device
        )
        self.data = stacked.data.view(num_layers, num_pages, *stacked.data.shape[1:])
        self.scales = (
            None
            if stacked.scales is None
            else stacked.scales.view(num_layers, num_pages, *stacked.scales.shape[1:])
        )
        self.layers = [
            KVPages(
                self.data[i], None if self.scales is None else self.scales[i], kv_dtype, head_dim
            )
            for i in range(num_layers)
        ]

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The stacked tensors, ``[layers, num_pages, ...]`` each, that make up a page."""
        return [self.data] if self.scales is None else [self.data, self.scales]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def bytes_per_token(self) -> float:
        """Bytes one token's K and V take across all layers, scales included."""
        return self.nbytes / (self.data.shape[1] * self.page_size)

    def layer(self, i: int) -> KVPages:
        return self.layers[i]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.layers[layer].write(slots, k, v)

    def step(self, slots: torch.Tensor) -> StepKV:
        """Where one step's new tokens go, for every layer (see ``StepKV``)."""
        return StepKV(self, slots)


class StepKV:
    """One step's K/V destination: the slot mapping, split into (page, offset) once.

    The model writes each layer's new K/V through it. The torch path needs the
    split as index tensors; it is computed on the first write and shared by
    every layer (two ops per step, not per layer). The fused Triton write
    divides in registers and reads ``slots`` directly.
    """

    __slots__ = ("storage", "slots", "kv_dtype", "_index")

    def __init__(self, storage: KVStorage, slots: torch.Tensor) -> None:
        self.storage = storage
        self.slots = slots
        self.kv_dtype = storage.kv_dtype
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None

    def pages(self, layer: int) -> KVPages:
        return self.storage.layers[layer]

    def index(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._index is None:
            ps = self.storage.page_size
            slots = self.slots.to(device=self.storage.data.device, dtype=torch.long)
            self._index = (slots // ps, slots % ps)
        return self._index

    def write_kv(self, layer: int, kv: torch.Tensor) -> None:
        """Store ``kv`` ``[T, 2, Hkv, D]`` (K then V of each token) for ``layer``."""
        self.storage.layers[layer].write_at(*self.index(), kv)
