"""Offload vs recompute on this machine: reloading p cached tokens from the host tier
against recomputing them (a prefill of p tokens), beside the cost model's prediction.

    .venv/bin/python bench/offload_vs_recompute.py
"""

from __future__ import annotations

import argparse
import json
import time

import common

from kvscope.app.progress import Progress
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.host_tier import HostTier
from kvscope.engine.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = load_model()
    engine = Engine(EngineConfig(kv_budget_bytes=512 << 20), loaded=loaded)
    host = HostTier(engine.storage.tensors, 512)
    cost = engine.offload_cost
    ps = engine.config.page_size
    rows = []
    lengths = (64, 256, 1024, 2048)
    progress = Progress(len(lengths), "lengths")  # the longest dominate: a rough ETA
    for p in lengths:
        ids = [1 + i % 4000 for i in range(p)]
        engine.score(ids[:32])  # warm-up
        t0 = time.perf_counter()
        engine.score(ids, chunk=p)
        recompute = time.perf_counter() - t0
        pages = list(range(p // ps))
        slots = [host.store(page)[0] for page in pages]
        t0 = time.perf_counter()
        for slot, page in zip(slots, pages, strict=True):
            host.load(slot, page)
        reload = time.perf_counter() - t0
        rows.append(
            {
                "tokens": p,
                "recompute_s": recompute,
                "reload_s": reload,
                "measured_ratio": recompute / reload,
                "model_recompute_s": cost.recompute_s * p,
                "model_reload_s": cost.load_s * p,
                "model_ratio": cost.recompute_over_load,
            }
        )
        progress.advance()
    if args.json:
        print(json.dumps(rows))
        return
    dev = engine.cost_device
    print(
        f"fp32 KV, page size 16; cost model (engine.sizing.reload_cost) with device preset {dev.name!r}: "
        f"{dev.fp16_tflops} TFLOP/s, {dev.pcie_gbps} GB/s host link"
    )
    print(
        common.table(
            [
                "cached tokens",
                "recompute s",
                "reload s",
                "measured ratio",
                "model recompute s",
                "model reload s",
                "model ratio",
            ],
            [
                [
                    r["tokens"],
                    r["recompute_s"],
                    r["reload_s"],
                    f"{r['measured_ratio']:.0f}x",
                    r["model_recompute_s"],
                    r["model_reload_s"],
                    f"{r['model_ratio']:.0f}x",
                ]
                for r in rows
            ],
        )
    )


if __name__ == "__main__":
    main()
