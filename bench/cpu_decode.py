"""How fast the torch CPU decode path reads the paged KV cache (SmolLM2-135M shapes).

For batch 1, 8, 32 and context 256..4096 it times one decode attention call
per layer, the way the engine calls it, and prints attention-only tokens/s
(batch / (layers x seconds per call)) and GB/s of what the call must move (K/V
read, which dominates, plus Q and the output), as the backend reports it,
beside the machine's measured copy bandwidth. Calls rotate over enough
distinct layer pools that the cache cannot hold the working set, as in a real
forward pass; each figure is the best of ``--repeats`` rounds. Run:
``.venv/bin/python bench/cpu_decode.py [--json]``.

``--engine`` measures the whole batch-1 decode step instead (the engine's
``step()`` over 64 new tokens, real model, each run in a fresh process), per
weight format; with ``--baseline REV`` it alternates runs of this checkout and
of commit REV (a git worktree), so a noisy shared machine shifts both alike:

    .venv/bin/python bench/cpu_decode.py --engine --baseline 6191dc4 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import torch

from kvscope.app.progress import Progress
from kvscope.kernels import AttentionMetadata, KVPages, paged_attention

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


ROOT = Path(__file__).resolve().parents[1]
# One batch-1 decode of 64 greedy tokens after a warm-up; prints tokens/s.
ENGINE_PROGRAM = r"""
import json, os, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.sampler import SamplingParams
engine = Engine(EngineConfig(kv_budget_bytes=1 << 28, weights_dtype=sys.argv[2], prefix_cache=False))
ids = engine.codec.encode("Write a short story about the sea number 0.")
engine.generate([ids], SamplingParams(max_tokens=8))  # warm-up
engine.add_request(ids, SamplingParams(max_tokens=65, ignore_eos=True))
engine.step()  # prefill and the first token
t0 = time.perf_counter()
produced = 0
while engine.has_unfinished():
    produced += len(engine.step())
print(json.dumps(produced / (time.perf_counter() - t0)))
"""


def engine_rate(root: Path, weights_dtype: str, threads: int) -> float | None:
    """tokens/s of one fresh-process run; None where that code lacks ``weights_dtype``."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if root != ROOT:  # a baseline commit's tree, for this subprocess only
        env = common.code_env(root, env)
    proc = subprocess.run(
        [sys.executable, "-c", ENGINE_PROGRAM, str(root), weights_dtype, str(threads)],
        capture_output=True, text=True, env=env, cwd=root, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        if "weights dtype must be one of" in proc.stderr:
            return None
        raise SystemExit(f"kvscope: error: decode run failed: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def engine_main(args: argparse.Namespace) -> None:
    """Batch-1 decode tokens/s per weight format, alternating with a baseline commit."""
    trees = {"now": ROOT}
    tmp = tempfile.TemporaryDirectory()
    if args.baseline:
        base = Path(tmp.name) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.baseline], check=True)  # fmt: skip
        trees = {f"before ({args.baseline})": base, "now": ROOT}
    try:
        rates: dict[tuple[str, str], list[float]] = {}
        progress = Progress(args.repeats * len(args.weights) * len(trees), "decode runs")
        for _ in range(args.repeats):
            for fmt in args.weights:
                for label, root in trees.items():
                    rate = engine_rate(root, fmt, args.threads)
                    progress.advance()
                    if rate is not None:
                        rates.setdefault((label, fmt), []).append(rate)
    finally:
        if args.baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)  # fmt: skip
        tmp.cleanup()
    if args.json:
        print(json.dumps({f"{k[0]}|{k[1]}": v for k, v in rates.items()}))
        return
    print(
        f"batch-1 decode, 64 tokens, {args.threads} threads, medians (min-max) of {args.repeats}, tokens/s"
    )
    for (label, fmt), values in rates.items():
        print(
            f"{label:>20} {fmt:>5}: {statistics.median(values):6.1f}  ({min(values):.1f}-{max(values):.1f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", action="store_true", help="time whole decode steps")
    parser.add_argument("--baseline", metavar="REV", help="with --engine: alternate with REV")
    parser.add_argument("--weights", nargs="+", default=["fp32", "bf16", "int8", "int4"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-format", default="fp32")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    args = parser.parse_args()
    if args.engine:
        engine_main(args)
        return
    copy_gbs = copy_bandwidth()
    progress = Progress(len(BATCHES) * len(CONTEXTS), "points")
    rows = []
    for b in BATCHES:
        for c in CONTEXTS:
            rows.append(measure(b, c, args.page_size, args.kv_format, args.repeats))
            progress.advance()
    if args.json:
        print(
            json.dumps(
                {"copy_gb_per_s": copy_gbs, "threads": torch.get_num_threads(), "rows": rows}
            )
        )
        return
    print(
        f"torch decode path, {args.kv_format} KV, page size {args.page_size}, "
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
