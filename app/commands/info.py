"""``kvscope info``: the model's shape and how much KV cache the budget buys.

Its default KV budget is ``kvscope run``'s (24 MiB), so ``info`` with the flags
of a ``run`` describes the pool that run starts with; ``run`` grows it for a
workload whose longest requests do not fit, unless ``--kv-budget`` is given.
"""

from __future__ import annotations

import argparse
import json

from app.commands.run import RUN_KV_BUDGET
from app.engine_options import add_engine_options, engine_config_from_args
from app.progress import loading_model


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="model shape, weight bytes, KV bytes per token, pages and tokens in the budget",
        description=__doc__,
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_engine_options(
        p,
        kv_budget=RUN_KV_BUDGET,
        offload="auto",
        kv_budget_note=", as kvscope run starts with (run grows it to fit a workload)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.engine import Engine

    config = engine_config_from_args(args)
    with loading_model(config.model):
        engine = Engine(config)
    c = engine.model_config
    info = {
        "model": engine.loaded.source,
        "architecture": c.architecture,
        "layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "q_heads": c.num_q_heads,
        "kv_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "context_length": c.max_position,
        "params": c.num_params,
        "weight_bytes": engine.model.weight_bytes,
        "kv_dtype": engine.config.kv_dtype,
        "kv_bytes_per_token": engine.bytes_per_token,
        "kv_budget_bytes": engine.kv_budget_bytes,
        "page_size": engine.config.page_size,
        "pages": engine.num_pages,
        "tokens_in_budget": engine.num_pages * engine.config.page_size,
    }
    if args.json:
        print(json.dumps(info))
        return 0
    width = max(map(len, info))
    for key, value in info.items():
        shown = (
            f"{value:,}"
            if isinstance(value, int)
            else (f"{value:,.1f}" if isinstance(value, float) else value)
        )
        print(f"{key:<{width}}  {shown}")
    return 0
