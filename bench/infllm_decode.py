"""Decode step time at a long context: InfLLM vs full attention, side by side on the CPU.

One request of ``--context`` tokens of corpus text (app/evals/corpus.py) is
prefilled in each mode on the real model, then ``--steps`` decode steps are
timed. Attention per step is what the attention path costs: the paged decode
kernel's own timing summed over layers, plus, for InfLLM, its retrieval work
(block scoring, reloads, attended-score accumulation) from its events.
Prints the median per step and full/infllm ratios (goal: attention >= 2x).
InfLLM retrieves ``--topk`` blocks (default 20: at 8,000 tokens that keeps
under 25% of the request's KV resident, the eval's setting) summarised by
``--repr`` (default centroid).
Run: ``.venv/bin/python bench/infllm_decode.py [--context 8000] [--topk 20] [--json]``;
``--smoke`` runs a short context for CI.
"""

from __future__ import annotations

import argparse
import json
import time

from common import median, table

from kvscope.app.evals.corpus import long_text_ids
from kvscope.app.progress import Progress
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import InfLLMRetrieval, KernelTiming
from kvscope.engine.loader import load_model
from kvscope.engine.sampler import SamplingParams


def measure(loaded, mode: str, context: int, steps: int, topk: int, repr_kind: str) -> dict:
    config = EngineConfig(
        kv_budget_bytes=512 << 20,
        host_budget_bytes=512 << 20,
        max_batched_tokens=512,
        attention_mode=mode,
        prefix_cache=False,
        infllm_topk_blocks=topk,
        infllm_repr=repr_kind,
    )
    engine = Engine(config, loaded=loaded)
    attention: dict[int, float] = {}

    def on_event(event) -> None:
        if isinstance(event, KernelTiming) and "decode" in event.name:
            attention[event.step] = attention.get(event.step, 0.0) + event.seconds
        elif isinstance(event, InfLLMRetrieval):
            attention[event.step] = attention.get(event.step, 0.0) + event.seconds

    engine.bus.subscribe(on_event)
    ids = long_text_ids(engine.codec.encode, context)
    rid = engine.add_request(ids, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    req = engine.requests[rid]
    while not req.output_ids:  # prefill
        engine.step()
    step_s = []
    decode_steps = []
    while engine.has_unfinished():
        decode_steps.append(engine.step_count)
        began = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - began)
    return {
        "mode": mode,
        "step_ms": 1e3 * median(step_s),
        "attention_ms": 1e3 * median([attention.get(s, 0.0) for s in decode_steps]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--topk", type=int, default=20, help="infllm blocks per layer and step")
    parser.add_argument("--repr", default="centroid", help="infllm block summary")
    parser.add_argument("--smoke", action="store_true", help="a short context (CI)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.context, args.steps = 1200, 4
    loaded = load_model()
    rows = {}
    progress = Progress(2, "modes")  # each: a long prefill, then the timed decode steps
    for m in ("full", "infllm"):
        rows[m] = measure(loaded, m, args.context, args.steps, args.topk, args.repr)
        progress.advance()
    ratio = {
        "step": rows["full"]["step_ms"] / rows["infllm"]["step_ms"],
        "attention": rows["full"]["attention_ms"] / rows["infllm"]["attention_ms"],
    }
    if args.json:
        document = {"context": args.context, "topk": args.topk, "repr": args.repr}
        print(json.dumps(document | {"rows": rows, "full_over_infllm": ratio}))
        return
    print(
        f"decode at {args.context} tokens of context, median of {args.steps} steps "
        f"(infllm: top-{args.topk}, {args.repr})"
    )
    print(
        table(
            ["mode", "step ms", "attention ms"],
            [[m, r["step_ms"], r["attention_ms"]] for m, r in rows.items()],
        )
    )
    print(f"full / infllm: step {ratio['step']:.2f}x, attention {ratio['attention']:.2f}x")


if __name__ == "__main__":
    main()
