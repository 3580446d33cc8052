"""``kvscope eval``: full attention vs InfLLM on the same inputs.

``eval passkey`` hides a 5-digit key at several depths of long filler text
and asks for it; ``eval perplexity`` scores a long deterministic text (built
from the bundled corpus in ``app/evals/corpus.py``) and compares perplexity and
top-1 agreement with full attention. Both report resident KV bytes per request.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

from kvscope.app.commands.run import RUN_KV_BUDGET
from kvscope.app.engine_options import (
    add_engine_options,
    engine_config_from_args,
    host_budget,
    parse_size,
)
from kvscope.app.evals.passkey import PASSKEY_MIN_TOKENS
from kvscope.app.progress import Progress, loading_model
from kvscope.app.sizing_args import positive_int
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import KvscopeError

MAX_LENGTH = 1 << 20  # tokens: past every model's context (checked exactly once it loads)


def _lengths(minimum: int):
    """``--lengths N,N``: token counts from ``minimum`` (what the task's prompt needs) up."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers, got {text!r}"
            ) from None
        if any(not minimum <= v <= MAX_LENGTH for v in values):
            raise argparse.ArgumentTypeError(
                f"lengths must be {minimum:,} to {MAX_LENGTH:,} tokens, got {text!r}"
            )
        return values

    parse.__name__ = "lengths"
    return parse


def _depths(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]  # NaN fails the range check below
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"depths must be in [0, 1], got {text!r}")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="compare full attention and InfLLM: passkey retrieval, perplexity",
        description=__doc__,
    )
    tasks = p.add_subparsers(dest="task", metavar="TASK")
    tasks.required = True
    pk = tasks.add_parser("passkey", help="passkey accuracy over context lengths and depths")
    pk.add_argument(
        "--lengths",
        type=_lengths(PASSKEY_MIN_TOKENS),
        default=[1024, 2048, 4096, 8000],
        metavar="N,N",
        help="prompt lengths in tokens (default 1024,2048,4096,8000)",
    )
    pk.add_argument(
        "--depths",
        type=_depths,
        default=[0.1, 0.5, 0.9],
        metavar="D,D",
        help="needle depths, 0 = start of the filler, 1 = end (default 0.1,0.5,0.9)",
    )
    ppl = tasks.add_parser("perplexity", help="perplexity and top-1 agreement on long text")
    ppl.add_argument(
        "--lengths",
        type=_lengths(2),
        default=[4096, 8000],
        metavar="N,N",
        help="text lengths in tokens (default 4096,8000)",
    )
    ppl.add_argument(
        "--chunk",
        type=positive_int,
        default=256,
        metavar="N",
        help="tokens scored per step (default 256)",
    )
    for task in (pk, ppl):
        task.add_argument("--seed", type=int, default=0, help="passkey digits / text seed")
        task.add_argument("--json", action="store_true", help="one JSON document on stdout")
        add_engine_options(
            task,
            kv_budget=RUN_KV_BUDGET,
            kv_budget_note=", as kvscope run and info; grown to hold the longest case",
        )
        # None: the user chose no budget, so it may be sized to the longest case.
        task.set_defaults(handler=run, kv_budget=None)


def run(args: argparse.Namespace) -> int:
    from kvscope.app.evals.compare import ANSWER_TOKENS, Comparison
    from kvscope.app.evals.report import passkey_table, perplexity_table, render

    grow = args.kv_budget is None and args.memory_fraction is None
    if args.kv_budget is None:
        args.kv_budget = parse_size(RUN_KV_BUDGET)
    config = engine_config_from_args(args)
    replace(config, attention_mode="infllm")  # its checks (float KV, no swap) before loading
    longest = max(args.lengths)
    with loading_model(config.model):
        comparison = Comparison(config)
    full = comparison.engines["full"]
    tokens = longest + (ANSWER_TOKENS if args.task == "passkey" else 0)
    if grow and full.max_request_tokens < min(tokens, full.model_config.max_position):
        # One case runs at a time: the pool holds the longest one (whole pages), as run's does.
        page = config.page_size
        needed = math.ceil(math.ceil(tokens / page) * page * full.bytes_per_token)
        print(
            f"[kvscope] KV budget {full.kv_budget_bytes / 2**20:.0f} MiB -> "
            f"{needed / 2**20:.0f} MiB: room for the longest case (--kv-budget sets it)",
            file=sys.stderr,
        )
        config = replace(
            config, kv_budget_bytes=needed, host_budget_bytes=host_budget(args, needed)
        )
        comparison = Comparison(config, loaded=full.loaded)
    limit = comparison.engines["full"].max_request_tokens
    if tokens > limit:
        raise KvscopeError(
            f"{longest} tokens exceed what one request may hold here ({limit}: the model's "
            "context and the KV budget); lower --lengths or raise --kv-budget"
        )
    if args.task == "passkey":
        cases = [(n, d) for n in args.lengths for d in args.depths]

        def measure(case: tuple[int, float]) -> list[dict]:
            return passkey_table(comparison.passkey(*case, args.seed))
    else:
        cases = list(args.lengths)

        def measure(case: int) -> list[dict]:
            return perplexity_table(comparison.perplexity(case, args.chunk, args.seed))

    table: list[dict] = []
    progress = Progress(len(cases), "cases")
    for i, case in enumerate(cases):
        rows = measure(case)
        table.extend(rows)
        progress.advance()
        if not args.json:  # long cases take minutes: print each as it completes
            print(render(rows, header=i == 0), flush=True)
    if args.json:
        document = {"task": args.task, "config": _infllm_config(config), "rows": table}
        print(json.dumps(document, indent=2))
    return 0


def _infllm_config(config: EngineConfig) -> dict:
    return {
        "page_size": config.page_size,
        "kv_dtype": config.kv_dtype,
        "initial_tokens": config.infllm_initial_tokens,
        "local_tokens": config.infllm_local_tokens,
        "topk_blocks": config.infllm_topk_blocks,
        "block_pages": config.infllm_block_pages,
        "repr": config.infllm_repr,
        "repr_tokens": config.infllm_repr_tokens,
        "max_batched_tokens": config.max_batched_tokens,
    }
