"""``kvscope info``: the model's shape and how much KV cache the budget buys.

Its default KV budget is ``kvscope run``'s (24 MiB), so ``info`` with the flags
of a ``run`` describes the pool that run starts with; ``run`` grows it for a
workload whose longest requests do not fit, unless ``--kv-budget`` is given.
With ``--load-format dummy`` every figure follows from the shape, so no weight
is drawn (an 8B model's took over a minute on the CPU), unless
``--memory-fraction`` asks for the budget measured from the built model.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvscope.app.commands.run import RUN_KV_BUDGET
from kvscope.app.engine_options import add_engine_options, engine_config_from_args
from kvscope.app.progress import loading_model
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.model_config import ModelConfig


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
    shape_only = args.load_format == "dummy" and args.memory_fraction is None
    config = engine_config_from_args(args, allocates=not shape_only)
    info = _from_shape(config) if shape_only else _from_engine(config)
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


def _from_engine(config: EngineConfig) -> dict[str, Any]:
    """The figures of a built engine: its weights as stored, its pool as sized."""
    from kvscope.engine.engine import Engine

    with loading_model(config.model):
        engine = Engine(config)
    return _figures(
        engine.loaded.source,
        engine.model_config,
        engine.config,
        engine.model.weight_bytes,
        engine.bytes_per_token,
        engine.kv_budget_bytes,
        engine.num_pages,
    )


def _from_shape(config: EngineConfig) -> dict[str, Any]:
    """The same figures for dummy weights, from the shape alone: the engine would draw
    random weights only to count their bytes (``stored_weight_bytes`` counts them)."""
    from kvscope.engine.dummy import SOURCE_PREFIX, dummy_config, stored_weight_bytes
    from kvscope.engine.engine import resolve_attention_backend
    from kvscope.engine.sizing import kv_bytes_per_token, pool_pages

    shape = dummy_config(config.model)
    resolve_attention_backend(config)  # the engine's refusal of a backend this device lacks
    per_token = kv_bytes_per_token(
        shape.num_layers, shape.num_kv_heads, shape.head_dim, config.kv_dtype
    )
    return _figures(
        f"{SOURCE_PREFIX}{shape.name}",
        shape,
        config,
        stored_weight_bytes(shape, config.weights_dtype, config.device),
        per_token,
        config.kv_budget_bytes,
        pool_pages(config.kv_budget_bytes, per_token, config.page_size),
    )


def _figures(
    source: str,
    c: ModelConfig,
    config: EngineConfig,
    weight_bytes: int,
    bytes_per_token: float,
    kv_budget_bytes: int,
    pages: int,
) -> dict[str, Any]:
    """One set of keys for both paths, so the shape's figures print as the engine's did."""
    return {
        "model": source,
        "architecture": c.architecture,
        "layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "q_heads": c.num_q_heads,
        "kv_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "context_length": c.max_position,
        "params": c.num_params,
        "weight_bytes": weight_bytes,
        "kv_dtype": config.kv_dtype,
        "kv_bytes_per_token": bytes_per_token,
        "kv_budget_bytes": kv_budget_bytes,
        "page_size": config.page_size,
        "pages": pages,
        "tokens_in_budget": pages * config.page_size,
    }
