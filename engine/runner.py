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

A step's inputs reach the device in one non-blocking copy from one pinned
staging buffer (``engine.staging``; a graphed step writes the graph's own
static buffers), and the sampled tokens are the only read back. With async
scheduling (``engine.async_step``) a decode row may take its input token from
the step still in flight: a ``TokenFeed`` copies it on the device, after the
staging copy, so the host never waits for it.

The CSR page table of a decode step is kept for the next one (``DecodeTable``):
while requests keep decoding, a step drops the rows of those that left and
inserts only the pages the others grew into, instead of rebuilding every
request's page list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvscope.engine.async_step import TokenFeed
from kvscope.engine.cuda_graphs import DecodeBatch, DecodeGraphs
from kvscope.engine.infllm import InfLLMMemory
from kvscope.engine.kernel_timer import KernelSink, KernelTimer
from kvscope.engine.kv_storage import KVStorage
from kvscope.engine.model import DecoderModel
from kvscope.engine.request import Request
from kvscope.engine.staging import StagingBuffer
from kvscope.engine.step_rows import DecodeTable, chunk_rows, decode_rows
from kvscope.kernels import KVPages, paged_attention
from kvscope.kernels.backend import paged_attention_cost, paged_kernel_name
from kvscope.kernels.metadata import AttentionMetadata

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
        self.staging = StagingBuffer(1 << 16, self.device)  # eager steps' inputs, grows
        self.table = DecodeTable()  # the last decode step's page table, kept for the next

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
            kv = self.storage.step(slots)  # the model writes K/V itself (fused with RoPE)
            return self.model.forward(token_ids, positions, attend, rows[: len(token_ids)], kv)

        self.graphs = DecodeGraphs(
            forward, max_num_seqs, max_pages_per_seq, self.storage.page_size, str(self.device)
        )
        self.graphs.capture(self.storage.data.shape[1], pad_page)

    def warm_up_prefill(self, max_batched_tokens: int) -> None:
        """Run one prefill of every query-length class up to ``max_batched_tokens`` (CUDA +
        Triton only), so the prefill kernel autotunes each ``q_class`` at start-up, not inside
        the first timed steps."""
        if self.device.type != "cuda" or self.backend != "triton":
            return
        capacity = self.storage.data.shape[1] * self.storage.page_size
        self.run_prefills(prefill_warmup_lengths(max_batched_tokens, capacity))
        torch.cuda.synchronize(self.device)

    def run_prefills(self, lengths: list[int]) -> None:
        """One stand-in prefill per length, over the pool's first pages. The writes land in
        pages no request holds yet (the pool is empty at start-up) and are overwritten
        before anything reads them."""
        ps = self.storage.page_size
        for n in lengths:
            inputs = self._stage([_Warmup(list(range(-(-n // ps))), n)], [n])
            self.execute_rows(inputs, inputs.logits_rows, report=False)

    # --- one step -------------------------------------------------------------------

    def prepare(
        self,
        requests: list[Request],
        num_new: list[int],
        all_logits: bool = False,
        feed: TokenFeed | None = None,
    ) -> StepInputs:
        """The step's inputs, staged with one host-to-device copy; a decode step that fits
        a graph bucket goes to the graph's own buffers. ``all_logits``: logits of every new
        token (scoring), not only of the rows that sample. ``feed``: rows whose input token
        the step in flight sampled (async scheduling), its ``dst`` indexing the step's
        tokens."""
        if self.infllm is not None:
            return self._stage(requests, num_new, all_logits, self.infllm.plan(requests, num_new))
        if self.graphs is not None and all(n == 1 for n in num_new):
            if self.graphs.bucket(len(requests)) is not None:
                return self._stage_graph(requests, all_logits, feed)
        return self._stage(requests, num_new, all_logits, feed=feed)

    def _stage_graph(
        self, requests: list[Request], all_logits: bool, feed: TokenFeed | None
    ) -> StepInputs:
        step = decode_rows(requests, self.storage.page_size, all_logits, self.table)
        graphs = self.graphs
        batch = graphs.stage(
            step.tokens, step.positions, step.slots, step.flat, step.indptr, step.last,
            step.kv_lens, len(step.rows) == len(requests), self.pad_page, feed,
        )  # fmt: skip
        n = len(requests)
        if feed is not None:  # in order: no index views (each costs about a microsecond)
            views = () if feed.in_order else graphs.feed_views(len(feed.dst))
            feed.apply(graphs.token_ids, *views)
        return StepInputs(
            token_ids=graphs.token_ids[:n],
            positions=graphs.positions[:n],
            slots=graphs.slots[:n],
            meta=graphs.meta(batch.size, batch.kv_lens),
            # A plain decode step samples every row and needs no gather (nor its copy).
            logits_rows=torch.tensor(
                step.rows, dtype=torch.long, device="cpu" if batch.all_sample else self.device
            ),
            sampling=step.sampling,
            graph_batch=batch,
        )

    def _stage(
        self,
        requests: list,
        num_new: list[int],
        all_logits: bool = False,
        meta: AttentionMetadata | None = None,
        feed: TokenFeed | None = None,
    ) -> StepInputs:
        """An eager step: every input in one staging buffer, one copy; ``meta`` given
        (InfLLM's own page tables) replaces the CSR table built here."""
        ps = self.storage.page_size
        b = len(requests)
        if all(n == 1 for n in num_new):
            # InfLLM rewrites a request's pages in place (offloaded blocks): no kept table.
            table = self.table if meta is None else None
            step = decode_rows(requests, ps, all_logits, table)
            cu: object = range(b + 1)
        else:
            self.table.clear()
            step = chunk_rows(requests, num_new, ps, all_logits)
            cu = step.cu
        tokens, positions, flat, rows = step.tokens, step.positions, step.flat, step.rows
        kv_lens, t = step.kv_lens, len(step.tokens)
        # Two blocks, each one section: int64 tokens | positions | slots | logits rows
        # [| fed rows | their sources], int32 cu_seqlens_q | kv_indptr | kv_last_page_len |
        # kv_indices; one copy for both.
        f = 0 if feed is None or feed.in_order else len(feed.dst)
        r, nnz = len(rows), len(flat)
        n64, n32 = 3 * t + r + 2 * f, 3 * b + 2 + nnz
        staging = self.staging
        staging.begin(8 * n64 + 4 * n32 + 16)
        at64 = staging.reserve(n64, torch.int64)
        at32 = staging.reserve(n32, torch.int32)
        h = staging.host(at64, n64, torch.int64)
        h[:t] = tokens
        h[t : 2 * t] = positions
        h[2 * t : 3 * t] = step.slots
        h[3 * t : 3 * t + r] = rows
        if f:
            h[3 * t + r : 3 * t + r + f] = feed.dst
            h[3 * t + r + f :] = feed.src
        h = staging.host(at32, n32, torch.int32)
        h[: b + 1] = cu
        h[b + 1 : 2 * b + 2] = step.indptr
        h[2 * b + 2 : 3 * b + 2] = step.last
        h[3 * b + 2 :] = flat
        staging.commit()
        # Every view costs about a microsecond: the fed rows' two only when there are some.
        views = staging.view(at64, n64, torch.int64).split(
            (t, t, t, r, f, f) if f else (t, t, t, r)
        )
        tok, pos, slots, logits_rows = views[:4]
        if feed is not None:
            feed.apply(tok, *views[4:])
        cu_q, kv_ptr, last, indices = staging.view(at32, n32, torch.int32).split(
            (b + 1, b + 1, b, nnz)
        )
        if meta is None:
            meta = AttentionMetadata(cu_q, kv_ptr, indices, last, ps, list(num_new), kv_lens)
        return StepInputs(tok, pos, slots, meta, logits_rows, step.sampling)

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
        return logits if inputs.graph_batch.all_sample else logits[inputs.logits_rows]

    def execute_rows(
        self, inputs: StepInputs, logits_rows: torch.Tensor, report: bool = True
    ) -> torch.Tensor:
        """Run the model eagerly; returns logits for the given rows of the flat batch."""
        timed = report and self.kernel_sink is not None
        attend, totals = self._attend(inputs.slots, inputs.meta, timed)
        kv = self.storage.step(inputs.slots)  # the model writes K/V itself (fused with RoPE)
        logits = self.model.forward(inputs.token_ids, inputs.positions, attend, logits_rows, kv)
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
            if k is not None:  # None: the model wrote this layer's K/V (StepKV)
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


def prefill_warmup_lengths(max_batched_tokens: int, capacity: int) -> list[int]:
    """One query length per ``q_class`` (power-of-two bucket) a prefill step can have:
    2, 4, 8, ... and the largest step itself; never more tokens than the pool holds."""
    top = min(max_batched_tokens, capacity)
    lengths = []
    n = 2
    while n < top:
        lengths.append(n)
        n *= 2
    return [*lengths, top] if top >= 2 else []


@dataclass(slots=True)
class _Warmup:
    """A stand-in request for ``warm_up_prefill``: ``n`` token-0 tokens over ``pages``."""

    pages: list[int]
    num_tokens: int
    num_computed: int = 0
    output_ids: tuple[int, ...] = ()

    @property
    def prompt_ids(self) -> list[int]:
        return [0] * self.num_tokens
