"""``kvscope generate``: run prompts as one continuous batch and print what the model wrote."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from kvscope.app.engine_options import add_engine_options, engine_config_from_args
from kvscope.app.progress import loading_model
from kvscope.app.sizing_args import finite
from kvscope.engine.errors import KvscopeError, RequestError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text for one or more prompts (one continuous batch)",
        description=__doc__,
    )
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.add_argument(
        "--chat",
        action="store_true",
        help="wrap each prompt as a user message in the model's chat template",
    )
    p.add_argument("--max-tokens", type=int, default=64, metavar="N")
    p.add_argument(
        "--temperature", type=finite, default=0.0, metavar="T", help="0 = greedy (default)"
    )
    p.add_argument("--top-p", type=finite, default=1.0, metavar="P")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off")
    p.add_argument("--seed", type=int, metavar="S")
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)"
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object per prompt per line, in input order"
    )
    add_engine_options(p)
    p.set_defaults(handler=run)


def _check_prompts(prompts: list[str], chat: bool) -> None:
    """An empty prompt has no token to generate from; said before the model loads, not
    after it (a chat template wraps even an empty message in tokens, so --chat takes one)."""
    empty = [str(i + 1) for i, prompt in enumerate(prompts) if not prompt]
    if empty and not chat:
        which = "prompt" if len(empty) == 1 else "prompts"
        raise KvscopeError(f"{which} {', '.join(empty)}: empty prompt (nothing to continue)")


def run(args: argparse.Namespace) -> int:
    from kvscope.engine.engine import Engine
    from kvscope.engine.sampler import SamplingParams

    _check_prompts(args.prompts, args.chat)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=list(args.stop),
    )
    config = engine_config_from_args(args)
    with loading_model(config.model):
        engine = Engine(config)
    context = engine.model_config.max_position
    if params.max_tokens > context:  # the context ends every request first anyway
        print(
            f"[kvscope] warning: --max-tokens {params.max_tokens:,} is past the model's context; "
            f"clamped to {context:,}",
            file=sys.stderr,
        )
        params = dataclasses.replace(params, max_tokens=context)
    ids: list[int | str] = []
    for i, prompt in enumerate(args.prompts):
        try:
            ids.append(engine.add_request(prompt, params, chat=args.chat))
        except RequestError as exc:
            # Refuse this prompt, keep the others running.
            print(f"kvscope: error: prompt {i + 1}: {exc}", file=sys.stderr)
            ids.append(str(exc))
    done = {out.request_id: out for out in engine.stream() if out.finished}
    for prompt, rid in zip(args.prompts, ids, strict=True):
        if isinstance(rid, str):
            if args.json:
                print(json.dumps({"prompt": prompt, "error": rid}))
            continue
        out = done[rid]
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": out.text,
                        "token_ids": out.token_ids,
                        "finish_reason": out.finish_reason,
                    }
                )
            )
        else:
            if len(args.prompts) > 1:
                print(f"--- {prompt}")
            print(out.text)
    return 2 if any(isinstance(r, str) for r in ids) else 0
