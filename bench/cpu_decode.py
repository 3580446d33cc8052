"""How fast the torch CPU decode path reads the paged KV cache (SmolLM2-135M shapes).

For batch 1, 8, 32 and context 256..4096 it times one decode attention call
per layer, the way the engine calls it, and prints attention-only tokens/s
(batch / (layers x seconds per call)) and GB/s of what the call must move (K/V
read, which dominates, plus Q and the output), as the backend reports it,
beside the machine's measured copy bandwidth. Calls rotate over enough
distinct layer pools that the cache cannot hold the working set, as in a real
forward pass; each figure is the best of ``--repeats`` rounds. Run:
``.venv/bin/python bench/cpu_decode.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from kernels import AttentionMetadata, KVPages, paged_attention

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, NUM_LAYERS = 9, 3, 64, 30
BATCHES = (1, 8, 32)
CONTEXTS = (256, 512, 1024, 2048, 4096)
WORKING_SET = 512 << 20  # bytes of KV rotated through per measurement, well past the caches


def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """GB/s of a plain tensor copy (bytes read + bytes written per second)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        began = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - began)
    return 2 * nbytes / best / 1e9


def measure(batch: int, context: int, page_size: int, kv_dtype: str, repeats: int) -> dict:
    pages_per_seq = math.ceil(context / page_size)
    num_pages = batch * pages_per_seq
    order = torch.randperm(num_pages).tolist()  # scattered pages, as after churn
    tables = [order[i * pages_per_seq : (i + 1) * pages_per_seq] for i in range(batch)]
    pool_bytes = KVPages.allocate(1, page_size, NUM_KV_HEADS, HEAD_DIM, kv_dtype).nbytes * num_pages
    num_pools = max(1, min(NUM_LAYERS, math.ceil(WORKING_SET / pool_bytes)))
    pools = []
    for _ in range(num_pools):
        pool = KVPages.allocate(num_pages, page_size, NUM_KV_HEADS, HEAD_DIM, kv_dtype)
        slots = torch.arange(num_pages * page_size)
        kv = torch.randn(2, len(slots), NUM_KV_HEADS, HEAD_DIM)
        pool.write(slots, kv[0], kv[1])
        pools.append(pool)
    meta = AttentionMetadata.build(tables, [1] * batch, [context] * batch, page_size)
    q = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM)
    reports: list[tuple[float, float]] = []  # (seconds, bytes) per call, from the backend

    def record(name: str, shape: str, seconds: float, flops: float, nbytes: float) -> None:
        reports.append((seconds, nbytes))

    for i in range((repeats + 1) * num_pools):
        pool = pools[i % num_pools]
        paged_attention(
            q, pool.data, meta, "torch", kv_dtype=kv_dtype, scales=pool.scales, on_kernel=record
        )
    # Best of the timed rounds (the first round warms up): on a shared machine the
    # median measures the neighbours as much as the code.
    seconds, nbytes = min(reports[num_pools:])
    return {
        "batch": batch,
        "context": context,
        "ms_per_call": seconds * 1e3,
        "tokens_per_s": batch / (NUM_LAYERS * seconds),
        "gb_per_s": nbytes / seconds / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-format", default="fp32")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    args = parser.parse_args()
    copy_gbs = copy_bandwidth()
    rows = [
        measure(b, c, args.page_size, args.kv_dtype, args.repeats)
        for b in BATCHES
        for c in CONTEXTS
    ]
    if args.json:
        print(
            json.dumps(
                {"copy_gb_per_s": copy_gbs, "threads": torch.get_num_threads(), "rows": rows}
            )
        )
        return
    print(
        f"torch decode path, {args.kv_dtype} KV, page size {args.page_size}, "
        f"{torch.get_num_threads()} threads; copy bandwidth {copy_gbs:.1f} GB/s (read + write)"
    )
    print(f"{'batch':>5} {'context':>7} {'ms/call':>8} {'tokens/s':>9} {'GB/s':>6}")
    for r in rows:
        print(
            f"{r['batch']:>5} {r['context']:>7} {r['ms_per_call']:>8.3f} "
            f"{r['tokens_per_s']:>9.1f} {r['gb_per_s']:>6.2f}"
        )


if __name__ == "__main__":
    main()
