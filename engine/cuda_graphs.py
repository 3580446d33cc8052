"""CUDA graphs for decode steps, one per batch-size bucket (as nano-vllm and vLLM do).

A decode step of a small model is dozens of tiny kernel launches per layer;
on a GPU the launches, not the math, set its speed. Capturing the whole
forward once per bucket (1, 2, 4, 8, then every 16 up to ``max_num_seqs``)
and replaying it costs one launch. A batch of ``n`` requests runs in the
smallest bucket ``>= n``: the spare rows are padding that read and write only
a scratch page no request owns, and their logits are dropped.

The graph's static inputs are sections of one staging buffer
(``engine.staging``): a step writes them on the host and one non-blocking
copy brings them over. The bucket and padding logic is plain Python (tested
on the CPU); graphs
themselves are captured only on CUDA with the Triton backend, whose kernels
take every length from device tensors (the torch path builds per-step
gather indices on the host, so it stays eager).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvscope.engine.async_step import TokenFeed
from kvscope.engine.staging import StagingBuffer
from kvscope.kernels.metadata import AttentionMetadata


def decode_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, 16, 32, 48, ... and ``max_num_seqs`` itself."""
    sizes = {b for b in (1, 2, 4, 8) if b <= max_num_seqs}
    sizes.update(range(16, max_num_seqs + 1, 16))
    sizes.add(max_num_seqs)
    return sorted(sizes)


def bucket_for(n: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding ``n`` rows; None when ``n`` exceeds them all."""
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else None


# The decode warm-up before capture gives every row this many tokens of context, so
# autotuning times the decode kernel on real work, not on 1-token contexts (a
# typical chat context; the split-K launch itself is sized by the graph's longest one).
TUNE_KV_LEN = 1024


@dataclass(slots=True)
class DecodeBatch:
    """One decode step padded to a bucket, already in the graph's staging buffer."""

    size: int  # the bucket
    num_real: int
    kv_lens: list[int]  # real rows' context lengths (new token included), then 1 per pad row
    all_sample: bool  # every real row samples (a plain decode step): no logits gather


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


class DecodeGraphs:
    """Static input buffers plus one captured graph per bucket; ``run`` replays the right one.

    The static inputs are sections of one fixed staging buffer (``engine.staging``):
    a step writes them on the host and one copy brings them to the device before
    the replay. ``forward(token_ids, positions, slots, meta)`` must return
    logits for every row and launch only device work (no host reads of device
    tensors).
    """

    def __init__(
        self,
        forward: Forward,
        max_num_seqs: int,
        max_pages_per_seq: int,
        page_size: int,
        device: str,
    ) -> None:
        self.buckets = decode_buckets(max_num_seqs)
        self.page_size = page_size
        self.device = torch.device(device)
        self.max_pages_per_seq = max_pages_per_seq
        top = self.buckets[-1]
        i64, i32 = torch.int64, torch.int32
        # Fixed sections, page indices last: a step copies up to its last page id only.
        # feed_dst/feed_src: rows fed a token by the step in flight (async scheduling).
        layout = (("token_ids", top, i64), ("positions", top, i64), ("slots", top, i64),
                  ("feed_dst", top, i64), ("feed_src", top, i64),
                  ("kv_indptr", top + 1, i32), ("kv_last_page_len", top, i32),
                  ("kv_indices", top * max_pages_per_seq, i32))  # fmt: skip
        self.staging = StagingBuffer(
            StagingBuffer.section_bytes(*((n, d) for _, n, d in layout)), device, fixed=True
        )
        self.staging.begin()
        self.offsets = {name: self.staging.reserve(n, d) for name, n, d in layout}
        self._sizes = {name: (n, d) for name, n, d in layout}
        self.token_ids, self.positions, self.slots, _, _, self.kv_indptr, self.kv_last_page_len, self.kv_indices = (
            self.staging.view(self.offsets[name], n, d) for name, n, d in layout
        )  # fmt: skip
        self.cu_seqlens_q = torch.arange(top + 1, dtype=torch.int32, device=self.device)
        self.max_kv_len = max_pages_per_seq * page_size
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._forward = forward
        self._pool = None

    def host(self, name: str, n: int | None = None):
        """The host side of static input ``name`` (its first ``n`` values), to fill in place."""
        size, dtype = self._sizes[name]
        return self.staging.host(self.offsets[name], size if n is None else n, dtype)

    def meta(self, bucket: int, kv_lens: list[int] | None) -> AttentionMetadata:
        """The step's metadata over the static buffers.

        A captured graph gets the longest possible context as its host-side kv_lens
        (Triton reads them only to size the split-K launch), so one graph serves every
        length; the uncaptured path passes the real ones (the torch backend reads them).
        """
        return AttentionMetadata(
            cu_seqlens_q=self.cu_seqlens_q[: bucket + 1],
            kv_indptr=self.kv_indptr[: bucket + 1],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:bucket],
            page_size=self.page_size,
            query_lens=[1] * bucket,
            kv_lens=kv_lens or [self.max_kv_len] * bucket,
        )

    def feed_views(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The device side of the fed rows' index sections ``stage`` wrote (first ``n``)."""
        return tuple(
            self.staging.view(self.offsets[name], n, torch.int64)
            for name in ("feed_dst", "feed_src")
        )

    def _call(self, bucket: int, kv_lens: list[int] | None = None) -> torch.Tensor:
        return self._forward(
            self.token_ids[:bucket],
            self.positions[:bucket],
            self.slots[:bucket],
            self.meta(bucket, kv_lens),
        )

    def stage(
        self,
        tokens: list[int],
        positions: object,
        slots: object,
        flat_pages: list[int],
        indptr: object,
        last_page_len: object,
        kv_lens: list[int],
        all_sample: bool,
        pad_page: int,
        feed: TokenFeed | None = None,
    ) -> DecodeBatch:
        """Write one decode step into the static inputs, padded to its bucket, and copy it
        to the device (one copy). Each pad row is one token at position 0 in ``pad_page``,
        a page no request owns; its logits are dropped. ``feed``'s index lists travel in
        the same copy (``TokenFeed.apply`` then writes the fed tokens on the device)."""
        n = len(tokens)
        bucket = self.bucket(n)
        assert bucket is not None, f"{n} rows fit no bucket"
        ps = self.page_size
        pages = len(flat_pages)
        extra = bucket - n
        self.staging.begin()
        ids = self.host("token_ids", bucket)
        ids[:n] = tokens
        ids[n:] = 0
        pos = self.host("positions", bucket)
        pos[:n] = positions
        pos[n:] = 0
        slot = self.host("slots", bucket)
        slot[:n] = slots
        slot[n:] = pad_page * ps
        ptr = self.host("kv_indptr", bucket + 1)
        ptr[: n + 1] = indptr
        ptr[n + 1 :] = range(pages + 1, pages + extra + 1)
        last = self.host("kv_last_page_len", bucket)
        last[:n] = last_page_len
        last[n:] = 1
        if feed is not None and not feed.in_order:
            self.host("feed_dst", len(feed.dst))[:] = feed.dst
            self.host("feed_src", len(feed.src))[:] = feed.src
        indices = self.host("kv_indices", pages + extra)
        indices[:pages] = flat_pages
        indices[pages:] = pad_page
        self.staging.commit(self.offsets["kv_indices"] + 4 * (pages + extra))
        return DecodeBatch(bucket, n, kv_lens + [1] * extra, all_sample)

    def stage_warmup(self, bucket: int, num_pages: int, pad_page: int, kv_len: int) -> list[int]:
        """Static inputs for the warm-up of ``bucket``: every row ``kv_len`` tokens of context
        over existing pages (read only; the pool is empty at start-up), its new K/V written to
        ``pad_page``. Returns the rows' kv_lens."""
        ps = self.page_size
        kv_len = max(1, min(kv_len, self.max_kv_len))
        per_row = -(-kv_len // ps)
        flat = [p % num_pages for p in range(bucket * per_row)]
        return self.stage(
            [0] * bucket,
            [kv_len - 1] * bucket,
            [pad_page * ps] * bucket,
            flat,
            range(0, bucket * per_row + 1, per_row),
            [kv_len - (per_row - 1) * ps] * bucket,
            [kv_len] * bucket,
            True,
            pad_page,
        ).kv_lens

    def capture(self, num_pages: int, pad_page: int, tune_kv_len: int = TUNE_KV_LEN) -> None:
        """Capture every bucket, largest first so the smaller ones reuse its memory pool.

        Each bucket first runs once outside the capture on real-sized contexts
        (``stage_warmup``): Triton compiles and autotunes there. Without CUDA
        nothing is captured and ``run`` calls the forward on the same buffers:
        the padding and buffer logic stays testable on the CPU.
        """
        if self.device.type != "cuda":
            return
        for bucket in reversed(self.buckets):
            self.stage_warmup(bucket, num_pages, pad_page, tune_kv_len)
            self._call(bucket)  # warm-up: compile and autotune outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                self.outputs[bucket] = self._call(bucket)
            if self._pool is None:
                self._pool = graph.pool()
            self.graphs[bucket] = graph
        torch.cuda.synchronize(self.device)

    def bucket(self, n: int) -> int | None:
        return bucket_for(n, self.buckets)

    def run(self, batch: DecodeBatch) -> torch.Tensor:
        """Logits ``[batch.num_real, vocab]`` of a batch ``stage`` has written."""
        bucket = batch.size
        graph = self.graphs.get(bucket)
        if graph is None:
            self.outputs[bucket] = self._call(bucket, batch.kv_lens)
        else:
            graph.replay()
        return self.outputs[bucket][: batch.num_real]
