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
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from kvscope.app.progress import Progress  # noqa: E402
from kvscope.app.workloads import QUESTIONS  # noqa: E402
from kvscope.engine.engine import Engine  # noqa: E402
from kvscope.engine.engine_config import EngineConfig  # noqa: E402
from kvscope.engine.loader import default_model_path, load_model  # noqa: E402
from kvscope.engine.sampler import SamplingParams  # noqa: E402


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


def bench_kvscope(
    loaded, token_ids: list[list[int]], new: int, weights_dtype: str
) -> tuple[float, int]:
    config = EngineConfig(
        kv_budget_bytes=512 << 20, max_num_seqs=len(token_ids), weights_dtype=weights_dtype
    )
    engine = Engine(config, loaded=loaded)
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
    rows = {}
    progress = Progress(3, "engine runs")  # kvscope fp32, kvscope bf16, transformers
    for wd in ("fp32", "bf16"):
        rows[f"kvscope, {wd} weights (one batch)"] = bench_kvscope(loaded, token_ids, args.new, wd)
        progress.advance()
    seconds, tokens = bench_transformers(token_ids, args.new, args.hf_batch)
    progress.advance()
    rows[f"transformers, fp32 (batch {args.hf_batch})"] = (seconds, tokens)
    base = tokens / seconds
    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        "seconds": s,
                        "tokens": t,
                        "tokens_per_s": t / s,
                        "vs_transformers": t / s / base,
                    }
                    for name, (s, t) in rows.items()
                }
            )
        )
        return
    print(
        f"{args.prompts} prompts x {args.new} new greedy tokens, {torch.get_num_threads()} threads, one run"
    )
    print(common_table(rows, base))


def common_table(rows: dict[str, tuple[float, int]], base: float) -> str:
    lines = [
        f"| {'engine':<36} | {'seconds':>7} | {'tokens':>6} | {'tok/s':>6} | {'vs transformers':>15} |"
    ]
    lines.append(f"|{'-' * 38}|{'-' * 9}|{'-' * 8}|{'-' * 8}|{'-' * 17}|")
    for name, (s, t) in rows.items():
        lines.append(
            f"| {name:<36} | {s:>7.1f} | {t:>6} | {t / s:>6.1f} | {t / s / base:>14.2f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
