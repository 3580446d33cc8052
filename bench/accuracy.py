"""Accuracy of every KV-cache dtype and weight format on the real model:
perplexity, mean KL divergence to the fp32 baseline, top-1 agreement.

A fixed text of a few thousand tokens (the docstrings of a fixed list of
Python standard-library modules, so it ships with Python and never changes
for a given Python version) is scored through the paged cache in chunks of
256 tokens, so every position attends to K/V read back from pages of the
format under test.

    .venv/bin/python bench/accuracy.py [--tokens 3000] [--only weights]

int4 is also scored in 1-token chunks, every position a 1-row step as in decode (the
path ``--weights-dtype auto`` decodes this 4-bit file with on the CPU).

Weight formats other than fp32 run with bf16 activations end to end (the
engine's rule since the decode-path rework): the bf16 row is the cost of bf16
activations and weights together, against the goals of +0.2% perplexity and
97% top-1 agreement, which the script checks and prints.
"""

from __future__ import annotations

import argparse
import importlib
import json

import common  # noqa: F401  (sets the import path and thread policy)
import torch
import torch.nn.functional as F

from kvscope.app.progress import Progress
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.loader import load_model
from kvscope.engine.sizing import KV_DTYPES

MODULES = [
    "argparse",
    "collections",
    "json",
    "textwrap",
    "heapq",
    "bisect",
    "functools",
    "itertools",
    "pickle",
    "csv",
    "random",
    "statistics",
    "string",
    "difflib",
]


def fixed_text() -> str:
    parts = []
    for name in MODULES:
        doc = importlib.import_module(name).__doc__ or ""
        parts.append(doc.strip())
    return "\n\n".join(parts)


def evaluate(loaded, ids: list[int], chunk: int = 256, **config) -> tuple[torch.Tensor, float]:
    """Log-probabilities at every position and the bytes one token of KV costs."""
    engine = Engine(EngineConfig(kv_budget_bytes=1 << 30, **config), loaded=loaded)
    logits = engine.score(ids, chunk=chunk)[:-1].float()
    return F.log_softmax(logits, -1), engine.bytes_per_token


def compare(
    logp: torch.Tensor, reference: torch.Tensor, target: torch.Tensor, ref_ppl: float | None
) -> dict:
    ppl = torch.exp(F.nll_loss(logp, target)).item()
    ref_ppl = ref_ppl or ppl
    return {
        "perplexity": ppl,
        "ppl_change_pct": 100 * (ppl / ref_ppl - 1),
        "mean_kl": F.kl_div(logp, reference, log_target=True, reduction="none")
        .sum(-1)
        .mean()
        .item(),
        "top1_agreement": (logp.argmax(-1) == reference.argmax(-1)).float().mean().item(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--only", choices=["all", "weights"], default="all", help="weights: skip KV dtypes"
    )
    args = ap.parse_args()
    loaded = load_model()
    ids = loaded.codec.encode(fixed_text())[: args.tokens]
    target = torch.tensor(ids[1:])
    kv_formats = list(KV_DTYPES) if args.only == "all" else []
    # (format, chunk): int4 also in 1-token chunks, each position a 1-row step, as decode
    # runs it (layers on one thread, the one-row RMSNorm): what --weights-dtype auto decodes
    # with for this 4-bit file on the CPU.
    weight_formats = [("fp32", 256), ("bf16", 256), ("int8", 256), ("int4", 256), ("int4", 1)]
    # One unit per scoring pass: the fp32 reference, each KV dtype, each weights dtype.
    progress = Progress(1 + len(kv_formats) + len(weight_formats), "scoring passes")
    reference, _ = evaluate(loaded, ids)
    progress.advance()
    ref_ppl = compare(reference, reference, target, None)["perplexity"]
    kv_rows = []
    for fmt in kv_formats:
        logp, per_token = evaluate(loaded, ids, kv_dtype=fmt)
        progress.advance()
        kv_rows.append(
            {
                "kv_dtype": fmt,
                "bytes_per_token": per_token,
                **compare(logp, reference, target, ref_ppl),
            }
        )
    weight_rows = []
    for fmt, chunk in weight_formats:
        logp, _ = evaluate(loaded, ids, chunk, weights_dtype=fmt)
        progress.advance()
        name = fmt if chunk > 1 else f"{fmt}, 1-token steps (decode)"
        weight_rows.append({"weights_dtype": name, **compare(logp, reference, target, ref_ppl)})
    if args.json:
        print(json.dumps({"tokens": len(ids), "kv": kv_rows, "weights": weight_rows}))
        return

    def cells(r: dict) -> list:
        return [
            r["perplexity"],
            f"{r['ppl_change_pct']:+.3f}",
            f"{r['mean_kl']:.2e}",
            f"{100 * r['top1_agreement']:.2f}%",
        ]

    print(
        f"{len(ids)} tokens of fixed text, chunks of 256, SmolLM2-135M; baseline: fp32 weights, fp32 KV"
    )
    if kv_rows:
        print(
            common.table(
                ["KV dtype", "bytes/token", "perplexity", "Δ ppl %", "mean KL", "top-1 agreement"],
                [[r["kv_dtype"], int(r["bytes_per_token"]), *cells(r)] for r in kv_rows],
            )
        )
        print()
    print(
        common.table(
            ["weights", "perplexity", "Δ ppl %", "mean KL", "top-1 agreement"],
            [[r["weights_dtype"], *cells(r)] for r in weight_rows],
        )
    )
    from kvscope.engine.device import resolve_weights_dtype

    print(f"--weights-dtype auto is {resolve_weights_dtype('auto', 'cpu')} here")
    bf16 = next(r for r in weight_rows if r["weights_dtype"] == "bf16")
    ok = bf16["ppl_change_pct"] <= 0.2 and bf16["top1_agreement"] >= 0.97
    print(
        f"bf16 activations + weights vs fp32: {bf16['ppl_change_pct']:+.3f}% perplexity "
        f"(goal <= +0.2%), {100 * bf16['top1_agreement']:.2f}% top-1 (goal >= 97%): "
        f"{'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
