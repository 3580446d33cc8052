"""``kvscope simulate``: replay a trace through three KV allocators under one memory budget.

Shows what paging buys over reserving the maximum length or growing by doubling:
token-slot utilization, fragmentation, batch, copies and queueing, from
``engine/alloc_sim``. ``--plot`` draws the timelines with plotly (HTML, or PNG
through kaleido).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvscope.app.db_argument import add_db_argument, db_path
from kvscope.app.output_format import format_table, human_bytes
from kvscope.app.progress import Progress
from kvscope.app.sizing_args import at_most, non_negative, plot_file, positive
from kvscope.app.workloads import MAX_REQUESTS
from kvscope.engine.alloc_sim import (
    Allocator,
    DoublingAllocator,
    MaxReservationAllocator,
    PagedAllocator,
    SimResult,
    replay,
)
from kvscope.engine.errors import KvscopeError
from kvscope.engine.presets import MODELS, model_preset
from kvscope.engine.sizing import GIB, KV_DTYPES, ModelShape
from kvscope.engine.traces import DISTRIBUTIONS, generate_trace, read_trace

MAX_LEN = 1 << 24  # tokens per request: past any model's context
PLOT_POINTS = 1000  # per series; enough for a smooth line, small enough for a light HTML file


# The budget's slots the simulation lays out: its last page map is an array of the
# budget's pages (hundreds of times a GPU's KV cache; --kv-gib 1e12 had been a
# MemoryError).
MAX_BUDGET_SLOTS = 1 << 28


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="compare max-reservation, doubling and paged KV allocation on a trace",
        description=(
            "Replay a request trace through three KV allocators under one budget. "
            "Utilization = mean tokens held / mean slots reserved."
        ),
    )
    trace = parser.add_argument_group("trace")
    trace.add_argument("--trace", metavar="FILE", help="JSONL: prompt_len, output_len, arrival_s")
    trace.add_argument("--distribution", choices=DISTRIBUTIONS, default="sharegpt")
    trace.add_argument("--requests", type=at_most(MAX_REQUESTS), default=200)
    trace.add_argument(
        "--prompt-len", type=at_most(MAX_LEN), default=512, help="fixed/uniform mean"
    )
    trace.add_argument(
        "--output-len", type=at_most(MAX_LEN), default=512, help="fixed/uniform mean"
    )
    trace.add_argument(
        "--rate",
        type=non_negative,
        default=0.0,
        help="Poisson arrivals per second (0: all at once)",
    )
    trace.add_argument("--seed", type=int, default=0)
    memory = parser.add_argument_group("budget")
    memory.add_argument(
        "--budget-tokens", type=at_most(MAX_BUDGET_SLOTS), help="KV budget in token slots"
    )
    memory.add_argument("--kv-gib", type=positive, help="KV budget in GiB (default 16384 slots)")
    memory.add_argument(
        "--preset",
        default="llama3-8b",
        help=f"model for bytes per token: {', '.join(MODELS)} (default llama3-8b)",
    )
    memory.add_argument("--kv-dtype", default="fp16", choices=list(KV_DTYPES))
    memory.add_argument("--page-size", type=at_most(1 << 16), default=16)
    memory.add_argument(
        "--max-model-len",
        type=at_most(MAX_LEN),
        default=2048,
        help="what max reservation reserves per request; generated requests are clipped to it",
    )
    parser.add_argument(
        "--step-ms", type=positive, default=25.0, help="one decode step, for arrivals"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot", metavar="FILE", type=plot_file, help="write charts to FILE.html or FILE.png"
    )
    add_db_argument(
        parser,
        positional=False,
        opt_in=True,
        help="also record each allocator as a run of kind 'simulation' in this kvscope database",
    )
    parser.set_defaults(handler=run)


def _budget_slots(args: argparse.Namespace, bytes_per_token: float) -> int:
    if args.budget_tokens and args.kv_gib:
        raise KvscopeError("give --budget-tokens or --kv-gib, not both")
    if args.kv_gib:
        slots = int(args.kv_gib * GIB // bytes_per_token)
        if slots > MAX_BUDGET_SLOTS:
            raise KvscopeError(
                f"--kv-gib {args.kv_gib:g} is {slots:,} token slots of this model's KV; "
                f"the simulation lays out at most {MAX_BUDGET_SLOTS:,}"
            )
        return slots
    return args.budget_tokens or 16384


def allocators(capacity: int, page_size: int, max_model_len: int) -> list[Allocator]:
    """The three contenders, in the order they are reported."""
    return [
        MaxReservationAllocator(capacity, max_model_len),
        DoublingAllocator(capacity),
        PagedAllocator(capacity, page_size),
    ]


def simulate(args: argparse.Namespace) -> dict[str, SimResult]:
    """Every allocator's result on the trace the flags describe, keyed by allocator name."""
    if args.trace:
        trace = read_trace(args.trace)
    else:
        trace = generate_trace(
            args.distribution,
            args.requests,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            max_len=args.max_model_len,
            rate=args.rate,
            seed=args.seed,
        )
    per_token = ModelShape.from_config(model_preset(args.preset)).bytes_per_token(args.kv_dtype)
    capacity = _budget_slots(args, per_token)
    contenders = allocators(capacity, args.page_size, args.max_model_len)
    # 10^5 requests take about a minute: say how far it got (only when it is long).
    progress = Progress(len(contenders), "allocators") if len(trace) >= 10_000 else None
    results = {}
    for allocator in contenders:
        results[allocator.name] = replay(
            trace, allocator, step_s=args.step_ms / 1000, kv_bytes_per_token=per_token
        )
        if progress:
            progress.advance()
    return results


_ROWS = (
    ("token-slot utilization", "utilization", "pct"),
    ("internal fragmentation", "internal_fragmentation", "pct"),
    ("external fragmentation", "external_fragmentation", "pct"),
    ("budget holding tokens", "memory_utilization", "pct"),
    ("max batch", "max_batch", "int"),
    ("mean batch", "mean_batch", "float"),
    ("mean waiting", "mean_waiting", "float"),
    ("max waiting", "max_waiting", "int"),
    ("preemptions", "preemptions", "int"),
    ("tokens recomputed", "recomputed_tokens", "int"),
    ("bytes copied", "bytes_copied", "bytes"),
    ("steps to finish", "steps", "int"),
)


def _cell(value: float, kind: str) -> str:
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "bytes":
        return human_bytes(value)
    return f"{value:,.1f}" if kind == "float" else f"{value:,}"


def summary_table(results: dict[str, SimResult]) -> str:
    rows = [
        [label, *(_cell(getattr(r, field), kind) for r in results.values())]
        for label, field, kind in _ROWS
    ]
    return format_table(rows, ["", *results])


def _series(result: SimResult) -> list[tuple[str, list[float]]]:
    t, capacity = result.timeline, result.capacity_slots
    return [
        (
            "token-slot utilization (held / reserved)",
            [h / r if r else 0.0 for h, r in zip(t.held, t.reserved, strict=True)],
        ),
        ("share of the budget holding tokens", [h / capacity for h in t.held]),
        ("running batch", t.running),
        ("requests waiting", t.waiting),
    ]


def figure(results: dict[str, SimResult], step_s: float) -> Any:
    """Every allocator's timelines: utilization, budget held, batch, queue (a plotly Figure)."""
    from plotly.subplots import make_subplots

    titles = [title for title, _ in _series(next(iter(results.values())))]
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles)
    colors = {"max_reservation": "#d62728", "doubling": "#ff7f0e", "paged": "#2ca02c"}
    for name, result in results.items():
        stride = max(1, result.steps // PLOT_POINTS)
        x = [i * step_s for i in range(0, result.steps, stride)]
        for n, (_, values) in enumerate(_series(result)):
            fig.add_scatter(
                x=x,
                y=values[::stride],
                name=f"{name} ({100 * result.utilization:.1f}%)",
                legendgroup=name,
                showlegend=n == 0,
                line={"color": colors[name], "width": 1.5},
                row=n // 2 + 1,
                col=n % 2 + 1,
            )
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=1)
    some = next(iter(results.values()))
    fig.update_layout(
        title=(
            f"KV allocation of {some.requests} requests in {some.capacity_slots:,} token slots "
            "(legend: mean token-slot utilization)"
        ),
        template="plotly_white",
        width=1200,
        height=760,
        legend={"orientation": "h", "y": -0.12},
    )
    return fig


def write_plot(fig: Any, path: str) -> None:
    target = Path(path)
    if target.suffix == ".png":
        try:
            fig.write_image(target, scale=1)
        except (ImportError, ValueError, RuntimeError) as exc:
            # Kaleido's reasons run to paragraphs (how to install Chrome): the first line
            first = next((line for line in str(exc).splitlines() if line.strip()), str(exc))
            raise KvscopeError(
                f"cannot write PNG {target} (is kaleido installed?): {first}"
            ) from None
    elif target.suffix in (".html", ".htm"):
        fig.write_html(target, include_plotlyjs=True)
    else:
        raise KvscopeError(f"--plot writes .html or .png, not {target.name}")


def run(args: argparse.Namespace) -> int:
    if args.db is not None:
        from kvscope.app.sim_record import check_database

        check_database(db_path(args))  # its errors before the simulation, not after
    results = simulate(args)
    if args.plot:
        write_plot(figure(results, args.step_ms / 1000), args.plot)
    if args.db is not None:
        path = db_path(args)
        from kvscope.app.sim_record import record_simulation

        config = {
            k: v
            for k, v in vars(args).items()
            if k not in ("handler", "db", "plot", "json") and not callable(v)
        }
        run_ids = record_simulation(path, results, config, args.step_ms / 1000, args.page_size)
        if not args.json:
            print(f"recorded runs {', '.join(map(str, run_ids))} in {path}")
    if args.json:
        print(json.dumps({name: r.summary() for name, r in results.items()}, indent=2))
    else:
        some = next(iter(results.values()))
        print(
            f"{some.requests} requests, budget {some.capacity_slots:,} token slots, "
            f"page size {args.page_size}, max length {args.max_model_len:,}\n"
        )
        print(summary_table(results))
    return 0
