"""The trace replay's fidelity and speed on the Mooncake conversation trace.

Fidelity: ``--timing sequential --page-size 512 --eviction-policy lru`` at every
capacity of the Mooncake paper's Figure 9, beside the paper's figures (read off
the plot, ../shared/traces/mooncake/README.md) and beside a plain ordered-dict
LRU over 512-token blocks with the same vLLM rules (full blocks only, last
prompt token always computed), which is both a cross-check of the counting and
the speed floor.

Speed, all measured in this run (a shared machine's load moves absolute
figures a lot, so each is also given as a ratio to the dict-LRU pass measured
here, and as CPU seconds):

- one capacity point of the whole trace, recording off and recorded to SQLite
  (the recorded figure includes the writer's final drain);
- the default sweep (8 capacities x 4 policies, plus the unlimited ceiling)
  over ``--workers`` processes;
- how the cost grows with trace length: the first 1/4, 1/2 and all of it.

    .venv/bin/python bench/replay.py [--trace PATH] [--capacity 3e6] [--workers 2]
        [--skip-sweep]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

from kvscope.app.commands.replay import DEFAULT_CAPACITIES, DEFAULT_POLICIES  # noqa: E402
from kvscope.app.output_format import format_table  # noqa: E402
from kvscope.app.progress import Progress  # noqa: E402
from kvscope.app.replay.session import RecordSession  # noqa: E402
from kvscope.engine.replay import ReplayConfig, ReplayDriver, prepare, read_replay_trace  # noqa: E402
from kvscope.engine.replay.sweep import run_sweep, sweep_configs  # noqa: E402

TRACE = (
    Path(__file__).resolve().parent.parent.parent
    / "shared/traces/mooncake/conversation_trace.jsonl"
)
# Figure 9 of the FAST'25 paper, read off the plot (the trace's README).
PAPER = {10**4: 0.045, 10**5: 0.07, 10**6: 0.085, 3 * 10**6: 0.165, 10**7: 0.33, 5 * 10**7: 0.40}
PAPER_CEILING = 0.40


def dict_lru(trace, capacity_tokens: int | None, block: int = 512) -> float:
    """An ordered-dict LRU over blocks with vLLM's counting rules: the floor for a replay."""
    cap = None if capacity_tokens is None else capacity_tokens // block
    lru: OrderedDict[int, None] = OrderedDict()
    hit = queried = 0
    for e in trace.entries:
        n, ids = e.input_len, e.blocks
        h = 0
        for b in ids[: (n - 1) // block]:
            if b not in lru:
                break
            lru.move_to_end(b)
            h += 1
        hit += h * block
        queried += n
        for b in ids[: n // block]:
            lru[b] = None
            lru.move_to_end(b)
        if cap is not None:
            while len(lru) > cap:
                lru.popitem(last=False)
    return hit / queried


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--capacity", type=float, default=3e6, help="the single point's capacity")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    if not args.trace.exists():
        print(f"no trace at {args.trace}", file=sys.stderr)
        return 2
    trace = read_replay_trace(args.trace)
    cap = int(args.capacity)
    n = len(trace)
    print(f"{args.trace.name}: {n:,} requests, {trace.input_tokens:,} input tokens, "
          f"{sum(len(e.blocks) for e in trace.entries):,} block ids")  # fmt: skip

    base_rate, base_s, _ = timed(lambda: dict_lru(trace, cap))
    prepared, prep_s, _ = timed(lambda: prepare(trace, 512))
    print(f"\ndict-LRU pass at {cap:.0e} tokens: {base_s:.3f} s ({base_rate:.1%}); "
          f"page keys built once per sweep: {prep_s:.2f} s")  # fmt: skip

    rows = []
    point_progress = Progress(4, "single points")

    def point(tr, label: str, record: bool = False) -> None:
        cfg = ReplayConfig(capacity_tokens=cap)
        if not record:
            result, wall, cpu = timed(
                lambda: ReplayDriver(
                    tr, cfg, prepared=prepare(tr, 512) if tr is not trace else prepared
                ).run()
            )
        else:
            with tempfile.TemporaryDirectory() as tmp:
                session = RecordSession(Path(tmp) / "replay.db", tr, "bench")

                def go():
                    bus, close = session.open(cfg)
                    r = ReplayDriver(tr, cfg, bus=bus, prepared=prepared).run()
                    close(r, "complete")
                    return r

                result, wall, cpu = timed(go)
        rows.append([label, f"{len(tr):,}", f"{wall:.2f}", f"{cpu:.2f}", f"{wall / base_s:.0f}x",
                     f"{result.hit_rate:.2%}"])  # fmt: skip
        point_progress.advance()
        return wall

    quarter = point(trace.head(n // 4), "1/4 trace, recording off")
    half = point(trace.head(n // 2), "1/2 trace, recording off")
    whole = point(trace, "whole trace, recording off")
    point(trace, "whole trace, recorded to SQLite", record=True)
    print(f"\none capacity point ({cap:.0e} tokens, lru, sequential, page 512):")
    print(format_table(rows, ["point", "requests", "wall s", "CPU s", "vs dict-LRU", "hit rate"]))
    print(f"scaling: 1/2 trace costs {half / quarter:.2f}x the 1/4, the whole {whole / quarter:.2f}x "
          f"(linear: 2x and 4x)")  # fmt: skip

    if args.skip_sweep:
        return 0
    caps = [int(float(c)) for c in DEFAULT_CAPACITIES.split(",")]
    policies = DEFAULT_POLICIES.split(",")
    configs = sweep_configs(ReplayConfig(), caps, policies, [512])
    configs += sweep_configs(ReplayConfig(), [None], ["lru"], [512])
    sweep_progress = Progress(len(configs), "sweep points")
    results, sweep_s, _ = timed(
        lambda: run_sweep(
            trace, configs, args.workers, progress=lambda *_: sweep_progress.advance()
        )
    )
    rate = {
        (c.eviction_policy, c.capacity_tokens): r.hit_rate
        for c, (r, _) in zip(configs, results, strict=True)
    }
    point_sum = sum(r.wall_s for r, _ in results)
    cpu_sum = sum(r.cpu_s for r, _ in results)
    print(f"\ndefault sweep: {len(caps)} capacities x {len(policies)} policies + the ceiling = "
          f"{len(configs)} points in {sweep_s:.1f} s over {args.workers} workers "
          f"(points' own times sum to {point_sum:.1f} s: {point_sum / sweep_s:.2f}x parallel; "
          f"their CPU time to {cpu_sum:.1f} s, {cpu_sum / args.workers:.1f} s a worker)")  # fmt: skip

    ceiling = rate[("lru", None)]
    fid = []
    for c in sorted(set(caps) | set(PAPER)):
        ours = rate.get(("lru", c))
        if ours is None:
            ours = (
                ReplayDriver(trace, ReplayConfig(capacity_tokens=c), prepared=prepared)
                .run()
                .hit_rate
            )
        paper = PAPER.get(c)
        fid.append([f"{c:.0e}", f"{ours:.1%}", f"{dict_lru(trace, c):.1%}",
                    "" if paper is None else f"{paper:.1%}",
                    "" if paper is None else f"{100 * (ours - paper):+.1f}",
                    f"{rate[('belady', c)]:.1%}" if ("belady", c) in rate else ""])  # fmt: skip
    fid.append(["unlimited", f"{ceiling:.1%}", f"{dict_lru(trace, None):.1%}", f"{PAPER_CEILING:.0%}",
                f"{100 * (ceiling - PAPER_CEILING):+.1f}", ""])  # fmt: skip
    print("\nfidelity (sequential, page 512, lru) against the Mooncake paper's Figure 9:")
    print(format_table(fid, ["capacity", "kvscope", "dict LRU", "paper", "points", "belady"]))
    worst = max(abs(rate[("lru", c)] - p) for c, p in PAPER.items()) * 100
    print(f"largest gap {worst:.1f} points (goal 4); ceiling gap "
          f"{100 * abs(ceiling - PAPER_CEILING):.1f} (goal 3)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
