"""What the miss reasons cost a replay, and how their memory stays bounded.

Replays the Mooncake conversation trace (sequential, page 512, lru) at a few
capacities and prints, per point, the replay's CPU time, the share of it spent
classifying admissions (``RadixCache.explain_misses``) and recording evictions
(``MissReasons.evicted``), the split itself, and what the tracker holds at the
end (evicted chain hashes, seen tokens; both capped). The share is measured by
wrapping the two calls in perf_counter pairs, in the same run, so a loaded
machine moves both sides alike; the wrapper's own cost (two clock reads a call)
is counted in the share, so it is an upper bound.

    .venv/bin/python bench/miss_reasons.py [--trace PATH] [--capacity 1e5,1e7]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvscope.app.progress import Progress
from kvscope.engine.miss_reasons import MissReasons
from kvscope.engine.radix_cache import RadixCache
from kvscope.engine.replay.driver import ReplayConfig, ReplayDriver, prepare
from kvscope.engine.replay.traces import read_replay_trace

# The trace in the project's shared/ folder beside the repository, wherever this runs from.
TRACE = str(
    Path(__file__).resolve().parent.parent.parent
    / "shared/traces/mooncake/conversation_trace.jsonl"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--capacity", default="1e4,1e5,1e6,1e7,none")
    args = parser.parse_args()
    trace = read_replay_trace(args.trace)
    prepared = prepare(trace, 512)
    spent = [0.0, 0.0]
    explain, evicted = RadixCache.explain_misses, MissReasons.evicted
    clock = time.perf_counter

    def timed_explain(self, tokens, hit_pages):
        t0 = clock()
        try:
            return explain(self, tokens, hit_pages)
        finally:
            spent[0] += clock() - t0

    def timed_evicted(self, chain, ts_ns, step):
        t0 = clock()
        evicted(self, chain, ts_ns, step)
        spent[1] += clock() - t0

    RadixCache.explain_misses = timed_explain
    MissReasons.evicted = timed_evicted
    print(f"{len(trace):,} requests, {trace.input_tokens:,} prompt tokens")
    print("capacity    cpu s  classify  evictions  share   cold  capacity  held (chains, tokens)")
    capacities = args.capacity.split(",")
    progress = Progress(len(capacities), "capacities")  # each: one replay of the whole trace
    for item in capacities:
        cap = None if item == "none" else int(float(item))
        spent[:] = [0.0, 0.0]
        driver = ReplayDriver(trace, ReplayConfig(capacity_tokens=cap), prepared=prepared)
        t0 = time.process_time()
        result = driver.run()
        cpu = time.process_time() - t0
        m = driver.kv.prefix_misses
        share = sum(spent) / cpu if cpu else 0.0
        held = driver.cache.misses.remembered
        print(
            f"{item:>9} {cpu:7.2f}  {spent[0]:7.2f}s  {spent[1]:8.2f}s  {share:5.1%}  "
            f"{m.cold / m.missed:5.1%}  {m.capacity / m.missed:7.1%}  {held[0]:,}, {held[1]:,}"
            f"  (hit {result.hit_rate:.1%})"
        )
        progress.advance()


if __name__ == "__main__":
    main()
