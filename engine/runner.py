"""Turns a scheduled batch into one model forward over the paged KV cache.

Builds the flat token batch, positions, slot mapping and the CSR page table
(``AttentionMetadata``) once per step, on the engine's device; every layer
then writes its new K/V through the slot mapping and calls the attention
backend with the same metadata. Attention time, FLOPs and bytes are summed
over layers and reported once per step: on the CPU the kernels' own wall-clock
timing, on CUDA event pairs resolved at a later step boundary
(``KernelTimer``), so timing never stalls the GPU.

On CUDA with the Triton backend, decode-only steps that fit a batch bucket
replay a captured CUDA graph (``engine.cuda_graphs``) instead of launching
the forward kernel by kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.cuda_graphs import DecodeBatch, DecodeGraphs, pad_decode
from engine.infllm import InfLLMMemory
from engine.kernel_timer import KernelSink, KernelTimer
from engine.kv_storage import KVStorage
from engine.model import DecoderModel
from engine.request import Request
from kernels import KVPages, paged_attention
from kernels.backend import paged_attention_cost, paged_kernel_name
from kernels.metadata import AttentionMetadata

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# Per kernel name: [shape, calls, seconds, FLOPs, bytes], summed over the layers of one step.
Totals = dict[str, list]


@dataclass(slots=True)
class StepInputs:
    token_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    sampling: list[Request]  # requests that sample a token this step (one per logits row)
    graph_batch: DecodeBatch | None = None  # set when a captured decode graph runs this step


class ModelRunner:
    def __init__(
        self,
        model: DecoderModel,
        storage: KVStorage,
        backend: str = "torch",
        device: str = "cpu",
        kernel_sink: KernelSink | None = None,
    ) -> None:
        self.model = model
        self.storage = storage
        self.backend = backend
        self.device = torch.device(device)
        self.kernel_sink = kernel_sink
        self.step = 0  # the engine step the next timings belong to
        self.timer = (
            KernelTimer(kernel_sink) if self.device.type == "cuda" and kernel_sink else None
        )
        self.graphs: DecodeGraphs | None = None
        self.pad_page = -1
        self.infllm: InfLLMMemory | None = None  # infllm attention: per-layer page tables

    # --- CUDA graphs ----------------------------------------------------------------

    def capture_decode_graphs(
        self, max_num_seqs: int, max_pages_per_seq: int, pad_page: int
    ) -> None:
        """Capture decode graphs per bucket; ``pad_page`` is a page no request ever owns."""
        self.pad_page = pad_page
        rows = torch.arange(max_num_seqs, device=self.device)

        def forward(
            token_ids: torch.Tensor,
            positions: torch.Tensor,
            slots: torch.Tensor,
            meta: AttentionMetadata,
        ) -> torch.Tensor:
            attend, _ = self._attend(slots, meta, timed=False)
            return self.model.forward(token_ids, positions, attend, rows[: len(token_ids)])

        self.graphs = DecodeGraphs(
            forward, max_num_seqs, max_pages_per_seq, self.storage.page_size, str(self.device)
        )
        self.graphs.capture()

    # --- one step -------------------------------------------------------------------

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
        kv_lens = [r.num_computed + n for r, n in zip(requests, num_new, strict=True)]
        page_tables = [r.pages for r in requests]
        graph_batch = None
        if self.graphs is not None and self.infllm is None and len(tokens) == len(requests):
            bucket = self.graphs.bucket(len(requests))
            if bucket is not None:
                batch = DecodeBatch(tokens, positions, slots, page_tables, kv_lens, len(tokens))
                graph_batch = pad_decode(batch, bucket, self.pad_page, page_size)
        # A graph step copies the batch into the graph's own buffers (DecodeGraphs.run):
        # its flat tensors stay on the host, saving a handful of copies per step.
        device = self.device if graph_batch is None else torch.device("cpu")
        return StepInputs(
            token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            meta=(
                AttentionMetadata.build(page_tables, list(num_new), kv_lens, page_size, device)
                if self.infllm is None
                else self.infllm.plan(requests, num_new)
            ),
            logits_rows=torch.tensor(logits_rows, dtype=torch.long, device=self.device),
            sampling=sampling,
            graph_batch=graph_batch,
        )

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Run the model; returns logits for ``inputs.sampling`` in order."""
        if inputs.graph_batch is None:
            return self.execute_rows(inputs, inputs.logits_rows)
        timer = self.timer
        if timer is None:
            logits = self.graphs.run(inputs.graph_batch)
        else:
            with timer.span():
                logits = self.graphs.run(inputs.graph_batch)
            timer.submit(self.step, "graph.decode_step", *self._step_cost(inputs.graph_batch))
        return logits[inputs.logits_rows]

    def execute_rows(self, inputs: StepInputs, logits_rows: torch.Tensor) -> torch.Tensor:
        """Run the model eagerly; returns logits for the given rows of the flat batch."""
        attend, totals = self._attend(inputs.slots, inputs.meta, self.kernel_sink is not None)
        logits = self.model.forward(inputs.token_ids, inputs.positions, attend, logits_rows)
        if self.infllm is not None:
            self.infllm.finish_step()
        for name, (shape, calls, seconds, flops, nbytes) in totals.items():
            shape = f"{shape} layers={calls}"
            if self.timer is None:
                self.kernel_sink(self.step, name, shape, seconds, flops, nbytes)
            else:
                self.timer.submit(self.step, name, shape, flops, nbytes)
        return logits

    def drain_timings(self, wait: bool = False) -> None:
        """Report the CUDA timings that have completed (all of them when ``wait``)."""
        if self.timer is not None:
            self.timer.drain(wait)

    # --- attention ------------------------------------------------------------------

    def _attend(
        self, slots: torch.Tensor, meta: AttentionMetadata, timed: bool
    ) -> tuple[AttendFn, Totals]:
        """The model's attention callback for one step, and the per-kernel totals it fills."""
        storage = self.storage
        backend = self.backend
        timer = self.timer if timed else None
        totals: Totals = {}
        infllm = self.infllm

        def add(name: str, shape: str, seconds: float, flops: float, nbytes: float) -> None:
            entry = totals.setdefault(name, [shape, 0, 0.0, 0.0, 0.0])
            entry[1] += 1
            entry[2] += seconds
            entry[3] += flops
            entry[4] += nbytes

        # The CPU path takes the kernels' own wall-clock report; CUDA records events
        # instead (the kernels' CUDA timing would synchronize after every call).
        on_kernel = add if timed and timer is None else None

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            pages = storage.layer(layer)
            pages.write(slots, k, v)
            step_meta = (
                meta if infllm is None else infllm.layer_metadata(layer, q, pages.data, meta)
            )
            if timer is None:
                return paged_attention(
                    q, pages.data, step_meta, backend=backend, kv_dtype=pages.kv_dtype,
                    scales=pages.scales, on_kernel=on_kernel,
                )  # fmt: skip
            with timer.span():
                out = paged_attention(
                    q, pages.data, step_meta, backend=backend, kv_dtype=pages.kv_dtype,
                    scales=pages.scales,
                )  # fmt: skip
            add(paged_kernel_name(backend, step_meta), *_attention_cost(q, pages, step_meta))
            return out

        return attend, totals

    def _step_cost(self, batch: DecodeBatch) -> tuple[str, float, float]:
        """A whole decode step: 2 FLOPs per weight per row and every weight byte read once,
        plus attention over each request's cached tokens in every layer."""
        cfg = self.model.config
        kv_tokens = sum(batch.kv_lens[: batch.num_real])
        flops = 2.0 * cfg.num_params * batch.num_real
        flops += 4.0 * kv_tokens * cfg.num_q_heads * cfg.head_dim * cfg.num_layers
        nbytes = self.model.weight_bytes + kv_tokens * self.storage.bytes_per_token
        return f"B={batch.num_real} bucket={batch.size} kv={kv_tokens}", flops, nbytes


def _attention_cost(
    q: torch.Tensor, pages: KVPages, meta: AttentionMetadata
) -> tuple[str, float, float, float]:
    """(shape, 0 seconds, FLOPs, bytes) of one attention call, counted as the kernels count."""
    shape, flops, nbytes = paged_attention_cost(q, pages.data, pages.scales, meta, pages.kv_dtype)
    return shape, 0.0, flops, nbytes
