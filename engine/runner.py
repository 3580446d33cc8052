"""Turns a scheduled batch into one model forward over the paged KV cache.

Builds the flat token batch, positions, slot mapping and the CSR page table
(``AttentionMetadata``) once per step; every layer then writes its new K/V
through the slot mapping and calls the attention backend with the same
metadata. Attention time, FLOPs and bytes are summed over layers and reported
once per step per kernel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model import DecoderModel
from engine.request import Request
from kernels.metadata import AttentionMetadata
from kernels.torch_paged import paged_attention_torch

KernelSink = Callable[[str, str, float, float, float], None]


@dataclass(slots=True)
class StepInputs:
    token_ids: torch.Tensor
    positions: torch.Tensor
    page_idx: torch.Tensor
    offsets: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    sampling: list[Request]  # requests that sample a token this step (one per logits row)


def attention_cost(meta: AttentionMetadata, num_q_heads: int, num_kv_heads: int, head_dim: int, elem_bytes: float) -> tuple[float, float]:
    """FLOPs (QK^T and PV, causal pairs only) and bytes moved (Q, K/V read, output)."""
    pairs = 0
    kv_read = 0
    for q_len, kv_len in zip(meta.query_lens, meta.kv_lens, strict=True):
        # query i (0-based among the new ones) sees kv_len - q_len + i + 1 keys
        pairs += q_len * (kv_len - q_len) + q_len * (q_len + 1) // 2
        kv_read += kv_len
    flops = 4.0 * pairs * num_q_heads * head_dim
    total_q = sum(meta.query_lens)
    nbytes = (2 * total_q * num_q_heads * head_dim * 4) + kv_read * 2 * num_kv_heads * head_dim * elem_bytes
    return flops, nbytes


class ModelRunner:
    def __init__(self, model: DecoderModel, storage, backend: str = "torch") -> None:
        self.model = model
        self.storage = storage
        self.backend = backend
        self.kernel_sink: KernelSink | None = None

    def prepare(self, requests: list[Request], num_new: list[int]) -> StepInputs:
        page_size = self.storage.page_size
        tokens: list[int] = []
        positions: list[int] = []
        page_idx: list[int] = []
        offsets: list[int] = []
        logits_rows: list[int] = []
        sampling: list[Request] = []
        for req, n in zip(requests, num_new, strict=True):
            start = req.num_computed
            ids = req.token_ids()
            tokens.extend(ids[start : start + n])
            pages = req.pages
            for pos in range(start, start + n):
                positions.append(pos)
                page_idx.append(pages[pos // page_size])
                offsets.append(pos % page_size)
            if start + n == req.num_tokens:
                logits_rows.append(len(tokens) - 1)
                sampling.append(req)
        meta = AttentionMetadata.build(
            [r.pages for r in requests],
            list(num_new),
            [r.num_computed + n for r, n in zip(requests, num_new, strict=True)],
            page_size,
        )
        return StepInputs(
            token_ids=torch.tensor(tokens, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            page_idx=torch.tensor(page_idx, dtype=torch.long),
            offsets=torch.tensor(offsets, dtype=torch.long),
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
        timed = self.kernel_sink is not None
        spent = 0.0

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            nonlocal spent
            storage.write(layer, inputs.page_idx, inputs.offsets, k, v)
            t0 = time.perf_counter() if timed else 0.0
            out = paged_attention_torch(q, storage.layer(layer), meta)
            if timed:
                spent += time.perf_counter() - t0
            return out

        logits = self.model.forward(inputs.token_ids, inputs.positions, attend, logits_rows)
        if timed:
            cfg = self.model.config
            flops, nbytes = attention_cost(meta, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, storage.pages.element_size())
            layers = cfg.num_layers
            name = "paged_decode" if meta.is_decode_only else "paged_prefill"
            shape = f"B={meta.num_requests} q={sum(meta.query_lens)} kv={sum(meta.kv_lens)} layers={layers}"
            self.kernel_sink(f"{self.backend}.{name}", shape, spent, flops * layers, nbytes * layers)
        return logits
