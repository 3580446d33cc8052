"""``kvscope replay TRACE``: put real traffic through kvscope's own KV-cache manager.

The question is how much KV cache a workload needs: the trace's requests go
through the engine's scheduler, radix prefix cache, eviction policies and host
tier with no model (engine/replay), at each capacity and policy asked for, and
the answer comes back as a table, JSON or a plot of hit rate against capacity
with the unlimited ceiling, plus the smallest capacity that reaches 90% of it
in tokens and GiB and what that leaves for the batch on the device.

With ``--db`` every point is recorded as a run of kind ``replay`` (config keys
``capacity_tokens``, ``eviction_policy``, ``page_size``, ``kv_dtype``,
``preset``, ``timing``, ``trace``, ``sweep_id``; hit and queried tokens in its
summary, from the events), so the TUI, dashboard and reports show it.

The replay machinery (engine/replay/driver.py and its sweep and routing) imports
torch; it is imported by the functions that run it, so that building the parser
(every ``kvscope`` command builds this one) takes only engine/replay/config.py.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscope.app.db_argument import add_db_argument, db_path
from kvscope.app.engine_options import parse_size
from kvscope.app.replay.session import RecordSession
from kvscope.app.replay.tables import (
    ROOFLINE_BATCH,
    _tokens_text,
    answer,
    answer_text,
    figure,
    miss_table,
    point_progress,
    refusal_warning,
    replica_table,
    table,
)
from kvscope.app.sizing_args import plot_file, positive, positive_int
from kvscope.engine.errors import KvscopeError
from kvscope.engine.eviction import POLICIES
from kvscope.engine.presets import DEVICES, MODELS, device_preset, model_preset
from kvscope.engine.replay.config import (
    ROUTINGS,
    TIMINGS,
    ReplayConfig,
    default_workers,
)
from kvscope.engine.replay.traces import FORMATS, ReplayTrace, is_database, read_replay_trace
from kvscope.engine.sizing import KV_DTYPES

if TYPE_CHECKING:
    pass


# Figure 9 of the Mooncake paper spans 10^4..10^8 tokens; 8 points over it.
DEFAULT_CAPACITIES = "1e4,1e5,1e6,3e6,1e7,3e7,5e7,1e8"

DEFAULT_POLICIES = "lru,lfu,fifo,belady"

DEFAULT_PRESET = "llama3-8b"

DEFAULT_ROUTINGS = "round-robin,prefix-aware"

# The context requests are refused beyond unless --max-model-len says: a preset only
# stands in for bytes per token, and llama3-8b's 8,192 would refuse half of the Mooncake
# trace (its longest request is 126,527 tokens); 2^20 is above every preset and trace
# shipped, so only a line no model could serve (1e8 tokens, which had hung) is refused.
DEFAULT_MAX_MODEL_LEN = 1 << 20

MAX_CAPACITY_TOKENS = 10**15  # far past any trace; the ceiling point is the unlimited one


def _capacity(text: str) -> tuple[float, str]:
    """One capacity: a token count (1e6, 3M, 250000) or a size (40GiB): (value, unit).

    A token count must be a whole number: 1.5e5 and 2.5M are, 1.5 is not (it had been
    taken as 1 and shown so). Counts are read as decimals, so 0.1k is exactly 100."""
    t = text.strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)", t, flags=re.IGNORECASE)
    if not m:
        raise KvscopeError(f"invalid capacity {text!r} (examples: 1e6, 3M, 40GiB)")
    unit = m.group(2).lower()
    if unit in ("", "k", "m"):
        count = Decimal(m.group(1))
        if count > MAX_CAPACITY_TOKENS:  # before any arithmetic: 1e9999999999 overflows it
            raise KvscopeError(f"capacity {text} is above {MAX_CAPACITY_TOKENS:.0e} tokens")
        count *= {"": 1, "k": 1000, "m": 10**6}[unit]
        if count < 1:
            raise KvscopeError(f"capacity must be > 0 tokens, got {text!r}")
        if count != count.to_integral_value():
            raise KvscopeError(
                f"--capacity {text.strip()} is not a whole number of tokens "
                "(a count like 150000, 1.5e5 or 2.5M, or a size like 40GiB)"
            )
        return float(count), "tokens"
    try:
        size = parse_size(t)
    except argparse.ArgumentTypeError as exc:
        raise KvscopeError(str(exc)) from None
    if size <= 0:
        raise KvscopeError(f"capacity must be > 0, got {text!r}")
    return float(size), "bytes"


def _list(text: str, option: str) -> list[str]:
    """A comma list's items. An empty item (``1e5,,1e6``, a trailing comma) is refused, not
    skipped: it is a point the user meant to ask for and would silently not get."""
    items = [s.strip() for s in text.split(",")]
    if not any(items):
        raise KvscopeError(f"{option} needs at least one item, got {text!r}")
    if "" in items:
        raise KvscopeError(f"{option} has an empty item in {text!r}")
    return items


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a production trace through kvscope's KV-cache manager: hit rate vs capacity",
        description=(
            "Replay a request trace (Mooncake, Qwen-Bailian, kvscope JSONL, or a kvscope "
            "database's run) through the engine's own scheduler, radix prefix cache, eviction "
            "and host tier, with no model, at each capacity and eviction policy given."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="JSONL trace, or a kvscope database")
    t = parser.add_argument_group("trace")
    t.add_argument("--format", choices=(*FORMATS, "db"), help="default: detected")
    t.add_argument(
        "--block-size", type=positive_int, help="tokens per hash id (default 512, bailian 16)"
    )
    t.add_argument(
        "--run", type=positive_int, help="with a database: the run to replay (default: newest)"
    )
    t.add_argument("--limit", type=positive_int, help="replay only the first N requests")
    c = parser.add_argument_group("cache")
    c.add_argument(
        "--capacity",
        "--kv-budget",
        dest="capacity",
        default=DEFAULT_CAPACITIES,
        help=f"comma list of capacities in tokens (1e6, 3M) or sizes (40GiB) (default {DEFAULT_CAPACITIES})",
    )
    c.add_argument(
        "--eviction-policy",
        default=DEFAULT_POLICIES,
        help=f"comma list of {', '.join(POLICIES)} (default {DEFAULT_POLICIES})",
    )
    c.add_argument("--page-size", default=None, help="comma list (default: the trace's block size)")
    c.add_argument("--kv-dtype", default="fp16", choices=list(KV_DTYPES))
    c.add_argument(
        "--preset",
        default=None,
        help=f"model for bytes per token and roofline: {', '.join(MODELS)} (default "
        f"{DEFAULT_PRESET})",
    )
    c.add_argument(
        "--max-model-len",
        type=positive_int,
        metavar="N",
        help="refuse requests whose prompt + output exceed N tokens, as vLLM does (default "
        f"{DEFAULT_MAX_MODEL_LEN:,}, not the preset's context: see README)",
    )
    c.add_argument("--offload", choices=("never", "always", "auto"), default="never")
    c.add_argument("--host-budget", type=parse_size, default=0, help="host tier size (e.g. 64GiB)")
    c.add_argument("--preemption", choices=("recompute", "swap"), default="recompute")
    c.add_argument(
        "--cache-outputs", action="store_true", help="also cache pages holding output tokens"
    )
    r = parser.add_argument_group("replicas")
    r.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="split each capacity over N engines and route each request (default 1)",
    )
    r.add_argument(
        "--routing",
        default=None,
        help=f"with --replicas: comma list of {', '.join(ROUTINGS)} (default {DEFAULT_ROUTINGS})",
    )
    tm = parser.add_argument_group("time")
    tm.add_argument("--timing", choices=TIMINGS, default="sequential")
    tm.add_argument("--device", default="h100-80", help=f"roofline device: {', '.join(DEVICES)}")
    tm.add_argument(
        "--speed",
        type=positive,
        default=None,
        help="roofline: divide arrival times by X (default 1)",
    )
    tm.add_argument(
        "--max-batched-tokens",
        type=positive_int,
        default=None,
        help=f"roofline: tokens per step (default {ROOFLINE_BATCH['max_batched_tokens']})",
    )
    tm.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=None,
        help=f"roofline: requests per step (default {ROOFLINE_BATCH['max_num_seqs']})",
    )
    o = parser.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.add_argument(
        "--plot", metavar="FILE", type=plot_file,
        help="hit rate vs capacity to FILE.html or FILE.png",
    )  # fmt: skip
    o.add_argument("--workers", type=positive_int, help=f"processes (default {default_workers()})")
    o.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_db_argument(
        parser, positional=False, opt_in=True,
        help="also record each point as a run of kind 'replay' in this kvscope database",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def _is_db_source(args: argparse.Namespace) -> bool:
    path = Path(args.trace)
    if not path.exists():
        raise KvscopeError(f"no such trace: {path}")
    return args.format == "db" or (args.format is None and is_database(path))


def check_options(args: argparse.Namespace) -> None:
    """Refuse, before any work, an option this source or mode would ignore: a flag
    silently dropped reads as a result the user did not get (each had been ignored)."""
    database = _is_db_source(args)
    if args.run is not None and not database:
        read_as = f"read as --format {args.format}" if args.format else "a JSONL trace"
        raise KvscopeError(
            f"--run {args.run} applies to a kvscope database source; {args.trace} is {read_as}"
        )
    if args.block_size is not None and database:
        raise KvscopeError(
            f"--block-size {args.block_size} does not apply to a database source: a recorded "
            "run's blocks are its pages, at the run's page size"
        )
    if args.routing is not None and args.replicas == 1:
        raise KvscopeError(f"--routing {args.routing} applies with --replicas N (N > 1)")
    if args.speed is not None and args.timing != "roofline":
        raise KvscopeError(
            f"--speed {args.speed:g} applies to --timing roofline (a {args.timing} replay "
            "runs one request after another and never reads arrival times)"
        )
    for flag, value in (
        ("--max-batched-tokens", args.max_batched_tokens),
        ("--max-num-seqs", args.max_num_seqs),
    ):
        if value is not None and args.timing != "roofline":
            raise KvscopeError(
                f"{flag} {value} applies to --timing roofline (a {args.timing} replay "
                "runs one request at a time, each in one step)"
            )
    for item in _list(args.capacity, "--capacity"):
        _capacity(item)
    _list(args.eviction_policy, "--eviction-policy")
    if args.page_size is not None:
        _list(args.page_size, "--page-size")


def load_trace(args: argparse.Namespace) -> ReplayTrace:
    path = Path(args.trace)
    if _is_db_source(args):
        from kvscope.app.replay_db import trace_from_run

        trace = trace_from_run(path, args.run)
    else:
        encode = None
        if args.format in (None, "kvscope"):
            encode = _lazy_encoder()
        trace = read_replay_trace(path, args.format, args.block_size, encode)
    if args.limit:
        trace = trace.head(args.limit)
    return trace


def _lazy_encoder() -> Callable[[str], list[int]]:
    """SmolLM2's tokenizer, loaded on the first text prompt (token-id traces need none)."""
    state: dict[str, Any] = {}

    def encode(text: str) -> list[int]:
        if "codec" not in state:
            from kvscope.engine.loader import load_model

            state["codec"] = load_model(None).codec
        return state["codec"].encode(text)

    return encode


def capacities(args: argparse.Namespace, bytes_per_token: float) -> list[int]:
    out = []
    for item in _list(args.capacity, "--capacity"):
        value, unit = _capacity(item)
        tokens = int(value // bytes_per_token) if unit == "bytes" else int(value)
        if tokens < 1:
            raise KvscopeError(f"capacity {item} holds no token of {bytes_per_token:.0f} bytes")
        if tokens > MAX_CAPACITY_TOKENS:
            raise KvscopeError(f"capacity {item} is above {MAX_CAPACITY_TOKENS:.0e} tokens")
        out.append(tokens)
    return sorted(set(out))


def configs(args: argparse.Namespace, trace: ReplayTrace) -> tuple[list[ReplayConfig], list[int]]:
    from kvscope.engine.replay.sweep import sweep_configs

    policies = _list(args.eviction_policy, "--eviction-policy")
    for p in policies:
        if p not in POLICIES:
            raise KvscopeError(f"unknown eviction policy {p!r}; choose from {', '.join(POLICIES)}")
    if args.page_size is None:
        page_sizes = [trace.block_size or 16]
    else:
        try:
            page_sizes = sorted({int(p) for p in _list(args.page_size, "--page-size")})
        except ValueError:
            raise KvscopeError(f"--page-size takes integers, got {args.page_size!r}") from None
        if min(page_sizes) < 1:
            raise KvscopeError("page size must be >= 1")
    preset = args.preset or DEFAULT_PRESET
    model_preset(preset)
    if args.timing == "roofline":
        device_preset(args.device)
    base = ReplayConfig(
        page_size=page_sizes[0],
        timing=args.timing,
        offload=args.offload,
        host_tokens=0,
        preemption=args.preemption,
        **{name: getattr(args, name) or default for name, default in ROOFLINE_BATCH.items()},
        model=preset,
        kv_dtype=args.kv_dtype,
        device=args.device,
        speed=args.speed or 1.0,
        cache_outputs=args.cache_outputs,
        max_model_len=max_model_len(args)[0],
    )
    bpt = base.bytes_per_token
    base.host_tokens = int(args.host_budget // bpt)
    if (args.offload != "never" or args.preemption == "swap") and base.host_tokens < 1:
        raise KvscopeError("--offload and --preemption swap need a --host-budget (e.g. 64GiB)")
    caps = capacities(args, bpt)
    points = sweep_configs(base, caps, policies, page_sizes)
    # The ceiling: unlimited capacity (no eviction, so one policy stands for all).
    points += sweep_configs(base, [None], [policies[0]], page_sizes)
    return points, caps


def max_model_len(args: argparse.Namespace) -> tuple[int, str]:
    """The context length requests are refused beyond, and what set it (for the warning):
    ``--max-model-len``, else ``DEFAULT_MAX_MODEL_LEN``. Not the preset's context, as
    vLLM's default would be: the preset only sizes the KV, and naming the default preset
    must not change the answer (llama3-8b's 8,192 would refuse 46% of Mooncake, a trace
    served at 128k)."""
    if args.max_model_len is not None:
        return args.max_model_len, "--max-model-len"
    return DEFAULT_MAX_MODEL_LEN, "the default; --max-model-len sets it"


def run(args: argparse.Namespace) -> int:
    check_options(args)  # before the trace is read: a text trace loads a tokenizer
    trace = load_trace(args)
    short, long = trace.inconsistent
    if (short or long) and not args.quiet:
        print(
            f"kvscope replay: warning: {short + long} of {len(trace)} requests have hash ids "
            f"inconsistent with input_length ({short} too few: their uncovered blocks count "
            f"as new content; {long} too many: the extra ids are ignored)",
            file=sys.stderr,
        )
    points, caps = configs(args, trace)
    if args.replicas > 1:
        check_replicas(args, points)  # refuse now, before any point runs or is recorded
    session = None
    if args.db is not None:
        # Everything above may refuse the input: only now does anything touch the database.
        from kvscope.db.store import open_db

        path = db_path(args)
        open_db(path).conn.close()  # a bad path fails here, once, not in every worker
        session = RecordSession(path, trace, uuid.uuid4().hex[:12])
    from kvscope.engine.replay.sweep import run_sweep

    t0 = time.perf_counter()
    progress = point_progress(len(points), args.quiet or len(points) == 1)
    results = run_sweep(trace, points, args.workers, session, progress)
    elapsed = time.perf_counter() - t0
    warning = refusal_warning(results, points, len(trace), max_model_len(args)[1])
    if warning:
        print(warning, file=sys.stderr)  # even with --quiet: it is about the figures
    rows = []
    for config, (result, run_id) in zip(points, results, strict=True):
        rows.append(
            {
                "capacity_tokens": config.capacity_tokens,
                "capacity_bytes": None if config.capacity_tokens is None
                else config.capacity_tokens * config.bytes_per_token,
                "policy": config.eviction_policy,
                "page_size": config.page_size,
                "hit_rate": result.hit_rate,
                "run_id": run_id,
                **{k: v for k, v in result.summary().items() if k not in ("hit_rate", "extra")},
                "miss_reasons": result.extra.get("miss_reasons"),
                "preempted_lookups": result.extra.get("preempted_lookups"),
            }
        )  # fmt: skip
    ceilings = {r["page_size"]: r["hit_rate"] for r in rows if r["capacity_tokens"] is None}
    first = points[0]
    answers = [
        answer([r for r in rows if r["page_size"] == ps], c, first, trace, first.eviction_policy)
        for ps, c in ceilings.items()
    ]
    replicated = replica_rows(args, trace, points) if args.replicas > 1 else []
    if args.plot:
        from kvscope.app.commands.simulate import write_plot

        write_plot(figure(rows, ceilings), args.plot)
    if args.json:
        print(
            json.dumps(
                {
                    "trace": trace.name,
                    "format": trace.format,
                    "requests": len(trace),
                    "input_tokens": trace.input_tokens,
                    "block_size": trace.block_size,
                    "timing": args.timing,
                    "preset": first.model,
                    "max_model_len": first.max_model_len,
                    "kv_dtype": args.kv_dtype,
                    "bytes_per_token": first.bytes_per_token,
                    "inconsistent_hash_ids": {"too_few": short, "too_many": long},
                    "elapsed_s": elapsed,
                    "points": rows,
                    "ceilings": {str(k): v for k, v in ceilings.items()},
                    "answers": answers,
                    "replicas": replicated,
                },
                indent=2,
            )
        )
        return 0
    print(table(rows, args.timing == "roofline"))
    print()
    print(miss_table(rows))
    if replicated:
        print()
        print(replica_table(replicated, rows))
    for a in answers:
        print()
        print(answer_text(a, first))
    if session is not None:
        ids = [r["run_id"] for r in rows]
        print(f"\nrecorded runs {min(ids)}..{max(ids)} (sweep {session.sweep_id}) in {session.db}")
    return 0


def check_replicas(args: argparse.Namespace, points: list[ReplayConfig]) -> None:
    """Known routings, and at least one page of capacity per replica."""
    for name in _list(args.routing or DEFAULT_ROUTINGS, "--routing"):
        if name not in ROUTINGS:
            raise KvscopeError(f"unknown routing {name!r}; choose from {', '.join(ROUTINGS)}")
    for config in points:
        cap = config.capacity_tokens
        if cap is not None and cap // args.replicas < config.page_size:
            raise KvscopeError(
                f"--capacity {cap} over {args.replicas} replicas is less than one page "
                f"of {config.page_size} tokens each"
            )


def replica_rows(
    args: argparse.Namespace, trace: ReplayTrace, points: list[ReplayConfig]
) -> list[dict[str, Any]]:
    """Each capacity point of the sweep again over ``--replicas`` engines, per routing."""
    from kvscope.engine.replay.routing import replay_replicas

    out = []
    for config in points:
        for name in _list(args.routing or DEFAULT_ROUTINGS, "--routing"):
            result = replay_replicas(trace, config, args.replicas, name)
            out.append(
                {
                    "capacity_tokens": config.capacity_tokens,
                    "policy": config.eviction_policy,
                    "page_size": config.page_size,
                    **result.summary(),
                }
            )
            if not args.quiet:
                print(
                    f"kvscope replay: {args.replicas} replicas, {name}, "
                    f"{_tokens_text(config.capacity_tokens)} {config.eviction_policy}: "
                    f"{result.hit_rate:.1%} hit ({result.wall_s:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return out
