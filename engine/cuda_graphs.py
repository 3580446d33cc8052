"""CUDA graphs for decode steps, one per batch-size bucket (as nano-vllm and vLLM do).

A decode step of a small model is dozens of tiny kernel launches per layer;
on a GPU the launches, not the math, set its speed. Capturing the whole
forward once per bucket (1, 2, 4, 8, then every 16 up to ``max_num_seqs``)
and replaying it costs one launch. A batch of ``n`` requests runs in the
smallest bucket ``>= n``: the spare rows are padding that read and write only
a scratch page no request owns, and their logits are dropped.

The bucket and padding logic is plain Python (tested on the CPU); graphs
themselves are captured only on CUDA with the Triton backend, whose kernels
take every length from device tensors (the torch path builds per-step
gather indices on the host, so it stays eager).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.metadata import AttentionMetadata


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


@dataclass(slots=True)
class DecodeBatch:
    """One decode step as host lists, padded to a bucket: what the graph's buffers take."""

    token_ids: list[int]
    positions: list[int]
    slots: list[int]
    page_tables: list[list[int]]
    kv_lens: list[int]
    num_real: int

    @property
    def size(self) -> int:
        return len(self.token_ids)


def pad_decode(batch: DecodeBatch, bucket: int, pad_page: int, page_size: int) -> DecodeBatch:
    """``batch`` grown to ``bucket`` rows; each pad row is one token at position 0 in ``pad_page``."""
    extra = bucket - batch.size
    assert extra >= 0, f"{batch.size} rows do not fit bucket {bucket}"
    return DecodeBatch(
        token_ids=batch.token_ids + [0] * extra,
        positions=batch.positions + [0] * extra,
        slots=batch.slots + [pad_page * page_size] * extra,
        page_tables=batch.page_tables + [[pad_page]] * extra,
        kv_lens=batch.kv_lens + [1] * extra,
        num_real=batch.num_real,
    )


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


class DecodeGraphs:
    """Static input buffers plus one captured graph per bucket; ``run`` replays the right one.

    ``forward(token_ids, positions, slots, meta)`` must return logits for every
    row and launch only device work (no host reads of device tensors).
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
        top = self.buckets[-1]

        def buffer(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=self.device)

        self.token_ids, self.positions, self.slots = buffer(top), buffer(top), buffer(top)
        self.cu_seqlens_q = torch.arange(top + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr = torch.zeros(top + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(
            top * max_pages_per_seq, dtype=torch.int32, device=self.device
        )
        self.kv_last_page_len = torch.ones(top, dtype=torch.int32, device=self.device)
        self.max_kv_len = max_pages_per_seq * page_size
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._forward = forward
        self._pool = None

    def _meta(self, bucket: int, kv_lens: list[int] | None) -> AttentionMetadata:
        # A captured graph gets the longest possible context as its host-side kv_lens
        # (Triton reads them only to size the split-K launch), so one graph serves every
        # length; the uncaptured path passes the real ones (the torch backend reads them).
        return AttentionMetadata(
            cu_seqlens_q=self.cu_seqlens_q[: bucket + 1],
            kv_indptr=self.kv_indptr[: bucket + 1],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:bucket],
            page_size=self.page_size,
            query_lens=[1] * bucket,
            kv_lens=kv_lens or [self.max_kv_len] * bucket,
        )

    def _call(self, bucket: int, kv_lens: list[int] | None = None) -> torch.Tensor:
        return self._forward(
            self.token_ids[:bucket],
            self.positions[:bucket],
            self.slots[:bucket],
            self._meta(bucket, kv_lens),
        )

    def capture(self) -> None:
        """Capture every bucket, largest first so the smaller ones reuse its memory pool.

        Without CUDA nothing is captured and ``run`` calls the forward on the same
        buffers: the padding and buffer logic stays testable on the CPU.
        """
        self.kv_indptr.copy_(torch.arange(len(self.kv_indptr), dtype=torch.int32))
        if self.device.type != "cuda":
            return
        for bucket in reversed(self.buckets):
            self._call(bucket)  # warm-up: Triton compiles and autotunes outside the capture
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
        """Logits ``[batch.num_real, vocab]`` for a batch already padded to a bucket."""
        bucket = batch.size
        meta = AttentionMetadata.build(
            batch.page_tables, [1] * bucket, batch.kv_lens, self.page_size
        )
        host = (
            (self.token_ids, torch.tensor(batch.token_ids)),
            (self.positions, torch.tensor(batch.positions)),
            (self.slots, torch.tensor(batch.slots)),
            (self.kv_indptr, meta.kv_indptr),
            (self.kv_indices, meta.kv_indices),
            (self.kv_last_page_len, meta.kv_last_page_len),
        )
        for dst, src in host:
            dst[: len(src)].copy_(src)
        graph = self.graphs.get(bucket)
        if graph is None:
            self.outputs[bucket] = self._call(bucket, batch.kv_lens)
        else:
            graph.replay()
        return self.outputs[bucket][: batch.num_real]
