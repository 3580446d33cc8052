"""Benchmark: the same 32 prompts x 64 new greedy tokens through kvscope and through transformers.

kvscope runs all 32 as one continuous batch; transformers runs ``generate`` in
batches of 8 with left padding (its usual batched use). Both use fp32 on the
CPU and the same GGUF weights, in one process, one after the other, so the
ratio is measured under the same machine conditions. Prints a table (and
``--json``).

    .venv/bin/python bench/vs_transformers.py [--prompts 32] [--new 64] [--hf-batch 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from app.workloads import QUESTIONS  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.engine_config import EngineConfig  # noqa: E402
from engine.loader import default_model_path, load_model  # noqa: E402
from engine.sampler import SamplingParams  # noqa: E402


def prompts(n: int) -> list[str]:
    topics = [
        "a GPU",
        "a KV cache",
        "a compiler",
        "the ocean",
        "a violin",
        "a bicycle",
        "rain",
        "coffee",
    ]
    out = []
    for i in range(n):
        out.append(
            f"{QUESTIONS[i % len(QUESTIONS)]} Also, say one thing about {topics[i % len(topics)]}."
        )
    return out


def bench_kvscope(loaded, token_ids: list[list[int]], new: int) -> tuple[float, int]:
    engine = Engine(
        EngineConfig(kv_budget_bytes=512 << 20, max_num_seqs=len(token_ids)), loaded=loaded
    )
    engine.generate(token_ids[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    outs = engine.generate(token_ids, SamplingParams(max_tokens=new, ignore_eos=True))
    seconds = time.perf_counter() - t0
    return seconds, sum(len(o.token_ids) for o in outs)


def bench_transformers(token_ids: list[list[int]], new: int, batch: int) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    pad = 2
    produced = 0

    def run(chunk: list[list[int]], n: int) -> int:
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(t)) + t for t in chunk])
        mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in chunk])
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=pad,
            )
        return (out.shape[1] - width) * len(chunk)

    run(token_ids[:2], 4)  # warm-up
    t0 = time.perf_counter()
    for i in range(0, len(token_ids), batch):
        produced += run(token_ids[i : i + batch], new)
    return time.perf_counter() - t0, produced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = load_model()
    token_ids = [
        loaded.codec.encode(loaded.codec.render_chat([{"role": "user", "content": p}]))
        for p in prompts(args.prompts)
    ]
    ks, kt = bench_kvscope(loaded, token_ids, args.new)
    hs, ht = bench_transformers(token_ids, args.new, args.hf_batch)
    rows = {
        "kvscope": {"seconds": ks, "tokens": kt, "tokens_per_s": kt / ks},
        "transformers": {"seconds": hs, "tokens": ht, "tokens_per_s": ht / hs},
    }
    ratio = rows["kvscope"]["tokens_per_s"] / rows["transformers"]["tokens_per_s"]
    if args.json:
        print(json.dumps({**rows, "ratio": ratio, "threads": torch.get_num_threads()}))
        return
    print(
        f"{args.prompts} prompts x {args.new} new greedy tokens, fp32, {torch.get_num_threads()} threads"
    )
    print(f"{'engine':<28}{'seconds':>10}{'tokens':>10}{'tok/s':>10}")
    print(f"{'kvscope (one batch)':<28}{ks:>10.1f}{kt:>10}{kt / ks:>10.1f}")
    print(f"{f'transformers (batch {args.hf_batch})':<28}{hs:>10.1f}{ht:>10}{ht / hs:>10.1f}")
    print(f"ratio kvscope / transformers: {ratio:.2f}x")


if __name__ == "__main__":
    main()
