"""What watching costs: engine tokens/s with no subscriber, with full recording to SQLite,
and with recording plus the terminal UI attached (headless Textual), in one run.

The default chat workload with all requests queued at once (no arrival
gaps, so the figure is the engine's throughput), modes alternated
``--repeats`` times; medians and the overhead against no subscriber.

    .venv/bin/python bench/recording_overhead.py [--requests 24] [--repeats 3] [--no-tui]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

import common

from kvscope.app.progress import Progress
from kvscope.app.run_job import drive
from kvscope.app.workloads import builtin
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.loader import load_model
from kvscope.profiler.recorder import Recorder


def run_once(loaded, items, mode: str, db: Path) -> float:
    engine = Engine(EngineConfig(kv_budget_bytes=24 << 20, offload="auto"), loaded=loaded)
    recorder = None
    if mode != "none":
        recorder = Recorder(db, {"bench": mode}, model="bench")
        engine.bus.subscribe(recorder.on_event)
        recorder.start()
    stop = threading.Event()
    t0 = time.perf_counter()
    if mode == "record+tui":
        _drive_under_tui(engine, items, db, recorder.run_id, stop)
    else:
        drive(engine, items, stop)
    seconds = time.perf_counter() - t0
    if recorder is not None:
        recorder.finish()
    return engine.total_output_tokens / seconds


def _drive_under_tui(engine, items, db: Path, run_id: int, stop: threading.Event) -> None:
    """The engine in a worker thread, the real TUI following the database, headless."""
    from kvscope.app.tui.app import KvscopeApp

    done = threading.Event()

    def job() -> None:
        drive(engine, items, stop)
        done.set()

    async def watch() -> None:
        app = KvscopeApp(str(db), run_id=run_id, follow=True)
        async with app.run_test(size=(120, 40)) as pilot:
            worker = threading.Thread(target=job)
            worker.start()
            while not done.is_set():
                await pilot.pause(0.1)
            worker.join()

    asyncio.run(watch())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-tui", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = load_model()
    items = builtin("chat", args.requests, rate=0.0)
    modes = ["none", "record"] + ([] if args.no_tui else ["record+tui"])
    results: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        run_once(loaded, items[:2], "none", Path(tmp) / "warm.db")
        progress = Progress(args.repeats * len(modes), "runs")
        for i in range(args.repeats):
            for mode in modes:
                results[mode].append(run_once(loaded, items, mode, Path(tmp) / f"{mode}-{i}.db"))
                progress.advance()
    medians = {m: common.median(v) for m, v in results.items()}
    base = medians["none"]
    if args.json:
        print(json.dumps({"tokens_per_s": results, "median": medians}))
        return
    print(
        f"chat workload, {args.requests} requests queued at once, {args.repeats} alternating repeats"
    )
    print(
        common.table(
            ["mode", "tokens/s (median)", "runs", "vs no subscriber"],
            [
                [
                    m,
                    medians[m],
                    ", ".join(f"{x:.1f}" for x in results[m]),
                    f"{100 * (medians[m] / base - 1):+.1f}%",
                ]
                for m in modes
            ],
        )
    )


if __name__ == "__main__":
    main()
