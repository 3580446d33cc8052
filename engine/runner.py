"""Turns a scheduled batch into one model forward over the paged KV cache.

Builds the flat token batch, positions, slot mapping and the CSR page table
(``AttentionMetadata``) once per step; every layer then writes its new K/V
through the slot mapping and calls the attention backend with the same
metadata. Attention time, FLOPs and bytes (computed by the kernels' backend) are
summed over layers and reported once per step per kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.infllm import InfLLMMemory
from engine.kv_storage import KVStorage
from engine.model import DecoderModel
from engine.request import Request
from kernels import paged_attention
from kernels.metadata import AttentionMetadata

KernelSink = Callable[[str, str, float, float, float], None]


@dataclass(slots=True)
class StepInputs:
    token_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    sampling: list[Request]  # requests that sample a token this step (one per logits row)


class ModelRunner:
    def __init__(self, model: DecoderModel, storage: KVStorage, backend: str = "torch") -> None:
        self.model = model
        self.storage = storage
        self.backend = backend
        self.kernel_sink: KernelSink | None = None
        self.infllm: InfLLMMemory | None = None  # infllm attention: per-layer page tables

    def prepare(self, requests: list[Request], num_new: list[int]) -> StepInputs:
        page_size = self.storage.page_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        sampling: list[Request] = []
        for req, n in zip(requests, num_new, strict=True):
            start = req.num_computed
            ids = req.token_ids()
            tokens.extend(ids[start : start + n])
            pages = req.pages
            for pos in range(start, start + n):
                positions.append(pos)
                slots.append(pages[pos // page_size] * page_size + pos % page_size)
            if start + n == req.num_tokens:
                logits_rows.append(len(tokens) - 1)
                sampling.append(req)
        if self.infllm is not None:
            meta = self.infllm.plan(requests, num_new)
        else:
            meta = AttentionMetadata.build(
                [r.pages for r in requests],
                list(num_new),
                [r.num_computed + n for r, n in zip(requests, num_new, strict=True)],
                page_size,
            )
        return StepInputs(
            token_ids=torch.tensor(tokens, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            meta=meta,
            logits_rows=torch.tensor(logits_rows, dtype=torch.long),
            sampling=sampling,
        )

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Run the model; returns logits for ``inputs.sampling`` in order."""
        return self.execute_rows(inputs, inputs.logits_rows)

    def execute_rows(self, inputs: StepInputs, logits_rows: torch.Tensor) -> torch.Tensor:
        """Run the model; returns logits for the given rows of the flat batch."""
        storage = self.storage
        meta = inputs.meta
        backend = self.backend
        totals: dict[str, list] = {}

        def on_kernel(name: str, shape: str, seconds: float, flops: float, nbytes: float) -> None:
            entry = totals.setdefault(name, [shape, 0, 0.0, 0.0, 0.0])
            entry[1] += 1
            entry[2] += seconds
            entry[3] += flops
            entry[4] += nbytes

        sink = on_kernel if self.kernel_sink is not None else None
        infllm = self.infllm

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            pages = storage.layer(layer)
            pages.write(inputs.slots, k, v)
            layer_meta = (
                meta if infllm is None else infllm.layer_metadata(layer, q, pages.data, meta)
            )
            return paged_attention(
                q,
                pages.data,
                layer_meta,
                backend=backend,
                kv_format=pages.kv_format,
                scales=pages.scales,
                on_kernel=sink,
            )

        logits = self.model.forward(inputs.token_ids, inputs.positions, attend, logits_rows)
        for name, (shape, calls, seconds, flops, nbytes) in totals.items():
            self.kernel_sink(name, f"{shape} layers={calls}", seconds, flops, nbytes)
        if infllm is not None:
            infllm.finish_step()
        return logits
