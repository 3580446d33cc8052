"""KV-cache dtype accuracy on the real model: perplexity, KL to the fp32 cache, top-1 agreement.

A fixed text of a few thousand tokens (the docstrings of a fixed list of
Python standard-library modules, so it ships with Python and never changes
for a given Python version) is scored through the paged cache in chunks of
256 tokens, so every position attends to K/V read back from pages of the
format under test.

    .venv/bin/python bench/kv_accuracy.py [--tokens 3000]
"""

from __future__ import annotations

import argparse
import importlib
import json

import common  # noqa: F401  (sets the import path and thread policy)
import torch
import torch.nn.functional as F

from engine.engine import Engine
from engine.engine_config import EngineConfig
from engine.loader import load_model
from engine.sizing import KV_FORMATS

MODULES = ["argparse", "collections", "json", "textwrap", "heapq", "bisect", "functools", "itertools", "pickle", "csv", "random", "statistics", "string", "difflib"]


def fixed_text() -> str:
    parts = []
    for name in MODULES:
        doc = importlib.import_module(name).__doc__ or ""
        parts.append(doc.strip())
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = load_model()
    ids = loaded.codec.encode(fixed_text())[: args.tokens]
    target = torch.tensor(ids[1:])
    reference = None
    rows = []
    for fmt in KV_FORMATS:
        engine = Engine(EngineConfig(kv_budget_bytes=1 << 30, kv_dtype=fmt), loaded=loaded)
        logits = engine.score(ids, chunk=256)[:-1].float()
        logp = F.log_softmax(logits, -1)
        ppl = torch.exp(F.nll_loss(logp, target)).item()
        if reference is None:
            reference, ref_ppl = logp, ppl
        kl = F.kl_div(logp, reference, log_target=True, reduction="none").sum(-1).mean().item()
        top1 = (logp.argmax(-1) == reference.argmax(-1)).float().mean().item()
        rows.append({
            "kv_dtype": fmt, "bytes_per_token": engine.bytes_per_token, "perplexity": ppl,
            "ppl_change_pct": 100 * (ppl / ref_ppl - 1), "mean_kl": kl, "top1_agreement": top1,
        })
    if args.json:
        print(json.dumps({"tokens": len(ids), "rows": rows}))
        return
    print(f"{len(ids)} tokens of fixed text, chunks of 256, SmolLM2-135M")
    print(common.table(
        ["KV dtype", "bytes/token", "perplexity", "Δ ppl %", "mean KL vs fp32", "top-1 vs fp32"],
        [[r["kv_dtype"], int(r["bytes_per_token"]), r["perplexity"], f"{r['ppl_change_pct']:+.3f}", f"{r['mean_kl']:.2e}", f"{100 * r['top1_agreement']:.2f}%"] for r in rows],
    ))


if __name__ == "__main__":
    main()
