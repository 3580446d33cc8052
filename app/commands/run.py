"""``kvscope run``: the main job. A real model on a workload, recorded to SQLite, shown live.

With a terminal attached it opens the terminal UI; with ``--headless`` (or no
terminal) it prints a progress line and a summary table. ``--json`` makes the
last line printed one JSON object with the run's headline figures.

Without ``--kv-budget`` the budget is 24 MiB, raised when the workload's longest
request would not fit: it then holds two of them at once, so every request can
run and pages are still short. Requests the engine refuses are counted, and
their reasons printed; a run whose every request was refused is recorded as
failed and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import threading

from kvscope.app.db_argument import add_db_argument, db_path
from kvscope.app.engine_options import (
    add_engine_options,
    engine_config_from_args,
    host_budget,
    parse_size,
)
from kvscope.app.progress import loading_model
from kvscope.app.sizing_args import at_most, non_negative, port
from kvscope.app.workloads import BUILTIN, MAX_REQUESTS, WorkItem, load_workload
from kvscope.engine.engine_config import EngineConfig

RUN_KV_BUDGET = "24MiB"  # small on purpose: prefix hits, eviction and preemption all happen
FIT_LONGEST = 2  # a budget sized to the workload holds this many of its longest requests


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a workload through the engine, record it, show it live (the main job)",
        description=__doc__,
    )
    p.add_argument(
        "--workload",
        default="chat",
        metavar="NAME|FILE.jsonl",
        help=f"one of {', '.join(BUILTIN)}, or a JSONL file (see app/workloads.py) (default chat); "
        "without --kv-budget the budget grows to fit its longest request",
    )
    p.add_argument(
        "--requests",
        type=at_most(MAX_REQUESTS),
        default=24,
        metavar="N",
        help="requests in a built-in workload (default 24)",
    )
    p.add_argument(
        "--rate",
        type=non_negative,
        default=4.0,
        metavar="R",
        help="Poisson arrival rate of built-in workloads, requests/s; 0: all at once (default 4)",
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="generate every request's max tokens, as vLLM's benchmarks do: output lengths, "
        "hence scheduling, preemptions and the KV they need, no longer depend on the text",
    )
    add_db_argument(p, positional=False, help="the database to record into")
    p.add_argument(
        "--headless",
        action="store_true",
        help="no terminal UI: a progress line and a summary table",
    )
    p.add_argument(
        "--json", action="store_true", help="print the summary as one JSON object (last line)"
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT while running",
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help=argparse.SUPPRESS)
    add_engine_options(
        p,
        kv_budget=RUN_KV_BUDGET,
        offload="auto",
        kv_budget_note=", grown to hold two of the workload's longest requests when they don't fit",
    )
    # None tells run() the user chose no budget, so it may size one to the workload.
    p.set_defaults(handler=run, kv_budget=None)


def _config_record(args: argparse.Namespace, engine) -> dict:
    """The run's configuration as stored with it: engine flags, workload, and the
    cost model's inputs (the dashboard puts its predictions beside the measurements)."""
    record = dataclasses.asdict(engine.config)
    record.update(
        workload=args.workload, requests=args.requests, rate=args.rate, seed=args.seed,
        ignore_eos=args.ignore_eos,
        kv_bytes_per_token=engine.bytes_per_token,
        params=engine.model_config.num_params, pages=engine.num_pages,
        kv_budget_sized_to_workload=args.kv_budget_sized,
        kv_budget_source=args.kv_budget_source, kv_budget_fit_requests=FIT_LONGEST,
    )  # fmt: skip
    return record


def workload_kv_bytes(engine, items: list[WorkItem]) -> int:
    """A KV budget that holds ``FIT_LONGEST`` of the workload's longest requests (prompt and
    output, up to the model's context) at once, in whole pages."""
    from kvscope.app.run_job import render_prompt

    context = engine.model_config.max_position
    prompts = [len(engine.codec.encode(render_prompt(engine, item))) for item in items]
    # A prompt the context cannot hold is refused whatever the budget: it does not size it.
    fitting = [
        min(n + item.max_tokens, context)
        for n, item in zip(prompts, items, strict=True)
        if n < context
    ]
    if not fitting:
        return 0
    longest = max(fitting)
    page_size = engine.config.page_size
    return math.ceil(
        FIT_LONGEST * math.ceil(longest / page_size) * page_size * engine.bytes_per_token
    )


def _run_config(args: argparse.Namespace) -> tuple[EngineConfig, bool]:
    """The engine's configuration, its flags checked, and whether its KV budget may be
    sized to the workload (the user chose none)."""
    fit = args.kv_budget is None and args.memory_fraction is None
    if args.kv_budget is None:
        args.kv_budget = parse_size(RUN_KV_BUDGET)
    return engine_config_from_args(args), fit


def _engine_for(args: argparse.Namespace, config: EngineConfig, fit: bool, items: list[WorkItem]):
    """The engine, its KV budget raised to fit the workload when ``fit``."""
    from kvscope.engine.engine import Engine

    with loading_model(config.model):
        engine = Engine(config)
    context = engine.model_config.max_position
    absurd = sum(item.max_tokens > context for item in items)
    if absurd:  # valid JSON, but no request can write past the context
        print(
            f"[kvscope] warning: {absurd} request(s) ask for more than the model's context of "
            f"{context:,} tokens; they stop at it",
            file=sys.stderr,
        )
    from kvscope.db.memory_budget import DEFAULT_BUDGET, GROWN_BUDGET, USER_BUDGET

    needed = workload_kv_bytes(engine, items) if fit else 0
    args.kv_budget_sized = needed > engine.kv_budget_bytes
    args.kv_budget_source = (
        GROWN_BUDGET if args.kv_budget_sized else DEFAULT_BUDGET if fit else USER_BUDGET
    )
    if args.kv_budget_sized:
        print(
            f"[kvscope] KV budget {engine.kv_budget_bytes / 2**20:.0f} MiB -> {needed / 2**20:.0f} MiB: "
            f"room for the workload's {FIT_LONGEST} longest requests (--kv-budget sets it)",
            file=sys.stderr,
        )
        grown = dataclasses.replace(
            config, kv_budget_bytes=needed, host_budget_bytes=host_budget(args, needed)
        )
        engine = Engine(grown, loaded=engine.loaded)
    return engine


def _print_progress(p) -> None:
    line = (
        f"\r[kvscope] {p.finished}/{p.total} requests done, {p.running} running, {p.waiting} waiting, "
        f"{p.output_tokens} tokens, {p.output_tokens / max(p.elapsed_s, 1e-9):.1f} tok/s, {p.elapsed_s:.0f} s"
    )
    if sys.stderr.isatty():
        print(line, end="", file=sys.stderr, flush=True)
    elif int(p.elapsed_s) % 5 == 0:
        print(line.strip(), file=sys.stderr, flush=True)


def _summary_table(summary: dict) -> str:
    from kvscope.db.miss_reasons import miss_line

    rows = [
        ("run", summary["run_id"]),
        ("status", summary["status"]),
        ("database", summary["db"]),
        ("requests finished", f"{summary['requests_finished']} / {summary['requests']}"),
        ("requests rejected", summary["requests_rejected"]),
        ("output tokens", summary["output_tokens"]),
        ("tokens/s", _fmt(summary["tokens_per_s"], ".1f")),
        (
            "TTFT p50 / p99",
            f"{_fmt(summary['ttft_p50_s'], '.3f')} s / {_fmt(summary['ttft_p99_s'], '.3f')} s",
        ),
        ("prefix hit rate", _fmt(summary["prefix_hit_rate"], ".1%")),
        ("prefix hit tokens", summary["prefix_hit_tokens"]),
        ("missed because", miss_line(summary.get("miss_reasons"))),
        ("evicted pages", summary["evicted_pages"]),
        ("offloaded pages", summary["offloaded_pages"]),
        ("preemptions", summary["preemptions"]),
        ("peak page usage", _fmt(summary["peak_page_usage"], ".1%")),
        ("mean token usage", _fmt(summary["mean_token_usage"], ".1%")),
        ("dropped events", summary["dropped_events"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def run(args: argparse.Namespace) -> int:
    from kvscope.app.run_job import drive, group_reasons
    from kvscope.db.miss_reasons import run_miss_reasons
    from kvscope.db.store import open_db
    from kvscope.profiler.recorder import Recorder

    items = load_workload(args.workload, args.requests, args.rate, args.seed)
    config, fit = _run_config(args)  # bad engine flags fail before a database is made
    db_file = str(db_path(args))
    open_db(db_file).conn.close()  # a bad --db fails now, before the model loads
    engine = _engine_for(args, config, fit, items)
    recorder = Recorder(db_file, _config_record(args, engine), model=engine.loaded.source)
    unsubscribe = engine.bus.subscribe(recorder.on_event)
    recorder.start()
    extras = _start_extras(args, engine, recorder)
    use_tui = not args.headless and not args.json and sys.stdout.isatty() and sys.stdin.isatty()
    progress = None if (use_tui or args.json) else _print_progress
    outcome: dict = {}

    def job(stop: threading.Event) -> dict:
        """Drive the workload, then close the run (so the UI shows its final status)."""
        outcome.update(drive(engine, items, stop, on_progress=progress, ignore_eos=args.ignore_eos))
        for close in extras:
            close()
        unsubscribe()
        if outcome["interrupted"]:
            status = "interrupted"
        elif outcome["rejected"] == outcome["submitted"] > 0:
            status = "failed"  # nothing ran: every request was refused
        else:
            status = "complete"
        return {**outcome, "summary": dataclasses.asdict(recorder.finish(status))}

    try:
        if use_tui:
            from kvscope.app.tui import run_tui

            run_tui(db_file, run_id=recorder.run_id, follow=True, job=job)
        else:
            job(threading.Event())
            if progress and sys.stderr.isatty():
                print(file=sys.stderr)
    except KeyboardInterrupt:
        pass  # marked interrupted below; the summary still prints
    finally:
        # Ctrl-C, a crash, or quitting before the job started: the run still gets a status.
        if recorder.summary is None:
            for close in extras:
                close()
            unsubscribe()
            recorder.finish(
                "interrupted" if sys.exc_info()[0] in (None, KeyboardInterrupt) else "failed"
            )
    summary = dataclasses.asdict(recorder.summary)
    summary["db"] = db_file
    misses = run_miss_reasons(db_file, recorder.run_id)
    summary["miss_reasons"] = None if misses is None else dataclasses.asdict(misses)
    for count, reason in group_reasons(outcome.get("rejections", [])):
        print(f"[kvscope] {count} rejected: {reason}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(_summary_table(summary))
    if summary["status"] == "interrupted":
        return 130
    if summary["status"] == "failed" and outcome.get("rejected"):
        print(
            f"kvscope: error: every request was rejected ({outcome['rejected']}, reasons above); "
            f"run {summary['run_id']} is recorded as failed",
            file=sys.stderr,
        )
        return 2
    return 0


def _start_extras(args: argparse.Namespace, engine, recorder) -> list:
    """Optional side services (GPU sampler, Prometheus endpoint); returns their closers."""
    from kvscope.profiler.gpu_sampler import GpuSampler

    closers = []
    sampler = GpuSampler(engine.bus, current_step=lambda: engine.step_count)
    if sampler.start():
        closers.append(sampler.stop)
    if args.metrics_port is not None:
        from kvscope.profiler.metrics import LiveMetrics
        from kvscope.profiler.prometheus import MetricsServer

        metrics = LiveMetrics(start_ns=recorder.start_ns)
        closers.append(engine.bus.subscribe(metrics.on_event))
        server = MetricsServer(
            metrics, args.metrics_port, args.metrics_host, model=engine.model_config.name
        )
        closers.append(server.close)
    return closers
