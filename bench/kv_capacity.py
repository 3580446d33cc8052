"""Capacity: under one fixed KV byte budget, how many concurrent requests each KV dtype admits.

For each dtype an engine gets the same byte budget; 400 identical-length
requests (prefix cache off, so nothing is shared) are queued and one
scheduling step runs: the scheduler admits as many as free pages allow.

    .venv/bin/python bench/kv_capacity.py [--budget-mib 64] [--prompt 240]
"""

from __future__ import annotations

import argparse
import json

import common

from kvscope.app.progress import Progress
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.loader import load_model
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.sizing import KV_DTYPES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-mib", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=240, help="prompt tokens per request")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = load_model()
    rows = []
    progress = Progress(len(KV_DTYPES), "KV dtypes")
    for fmt in KV_DTYPES:
        engine = Engine(
            EngineConfig(
                kv_budget_bytes=args.budget_mib << 20,
                kv_dtype=fmt,
                prefix_cache=False,
                max_num_seqs=10_000,
                max_batched_tokens=1 << 30,
            ),
            loaded=loaded,
        )
        for i in range(400):
            engine.add_request(
                [1 + (i + j) % 500 for j in range(args.prompt)], SamplingParams(max_tokens=1)
            )
        engine.scheduler.schedule()  # admission only: no forward pass needed to count
        admitted = len(engine.scheduler.running)
        rows.append(
            {
                "kv_dtype": fmt,
                "bytes_per_token": engine.bytes_per_token,
                "pages": engine.num_pages,
                "tokens": engine.num_pages * engine.config.page_size,
                "requests": admitted,
            }
        )
        progress.advance()
    fp16 = next(r for r in rows if r["kv_dtype"] == "fp16")
    for r in rows:
        r["vs_fp16"] = r["requests"] / fp16["requests"]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"KV budget {args.budget_mib} MiB, requests of {args.prompt} prompt tokens, page size 16")
    print(
        common.table(
            ["KV dtype", "bytes/token", "pages", "token slots", "concurrent requests", "vs fp16"],
            [
                [
                    r["kv_dtype"],
                    int(r["bytes_per_token"]),
                    r["pages"],
                    r["tokens"],
                    r["requests"],
                    f"{r['vs_fp16']:.2f}x",
                ]
                for r in rows
            ],
        )
    )


if __name__ == "__main__":
    main()
