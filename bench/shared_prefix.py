"""Shared system prompt: N requests sharing a ~1,000-token prefix, prefix cache on vs off.

All requests are queued at once and run as one continuous batch; prints the
prefill tokens actually computed and the end-to-end time of each mode,
measured in the same run, and their ratios.

    .venv/bin/python bench/shared_prefix.py [--requests 64] [--new 8]
"""

from __future__ import annotations

import argparse
import json
import time

import common

from kvscope.app.progress import Progress
from kvscope.app.workloads import DOCUMENT, QUESTIONS, SYSTEM_PROMPT
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import EventBus, StepSummary
from kvscope.engine.loader import load_model
from kvscope.engine.sampler import SamplingParams


def run(loaded, prompts: list[list[int]], new: int, prefix_cache: bool) -> dict:
    bus = EventBus()
    prefill = [0]
    bus.subscribe(
        lambda e: (
            prefill.__setitem__(0, prefill[0] + e.prefill_tokens)
            if isinstance(e, StepSummary)
            else None
        )
    )
    engine = Engine(
        EngineConfig(kv_budget_bytes=1 << 30, prefix_cache=prefix_cache, max_num_seqs=len(prompts)),
        bus=bus,
        loaded=loaded,
    )
    t0 = time.perf_counter()
    engine.generate(prompts, SamplingParams(max_tokens=new, ignore_eos=True))
    return {"seconds": time.perf_counter() - t0, "prefill_tokens": prefill[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = load_model()
    shared = SYSTEM_PROMPT + "\n\n" + DOCUMENT * 5
    prompts = [
        loaded.codec.encode(
            loaded.codec.render_chat(
                [
                    {"role": "system", "content": shared},
                    {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (ticket {i})"},
                ]
            )
        )
        for i in range(args.requests)
    ]
    prefix_len = min(len(p) for p in prompts)
    progress = Progress(2, "runs")  # prefix cache on, then off
    on = run(loaded, prompts, args.new, True)
    progress.advance()
    off = run(loaded, prompts, args.new, False)
    progress.advance()
    result = {
        "requests": args.requests,
        "prompt_tokens": sum(map(len, prompts)),
        "on": on,
        "off": off,
        "speedup": off["seconds"] / on["seconds"],
        "prefill_ratio": off["prefill_tokens"] / on["prefill_tokens"],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.requests} requests, ~{prefix_len} shared prompt tokens each, {args.new} new tokens each"
    )
    print(
        common.table(
            ["prefix cache", "prefill tokens computed", "end-to-end s"],
            [
                ["on", on["prefill_tokens"], on["seconds"]],
                ["off", off["prefill_tokens"], off["seconds"]],
            ],
        )
    )
    print(
        f"prefill tokens: {result['prefill_ratio']:.1f}x fewer; end to end: {result['speedup']:.1f}x faster"
    )


if __name__ == "__main__":
    main()
