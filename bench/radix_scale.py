"""The prefix cache at GPU scale: eviction and step time at 1k, 10k and 100k pages.

An 8B-shape run on one H200 has about 55,000 pages. For each pool size the
tiny test model's engine gets a pool filled to the brim with cached chains
(kvscope.engine.tiny's fill_cache, as tests/test_scale.py), then:

- eviction: time ``evict`` taking pages in batches of 8 (as the scheduler's
  reclaim does) until 800 pages are freed: microseconds per evicted page;
- steps: a workload with a shared prompt stem that must evict as it goes:
  mean step time (the model is tiny, so cache and bookkeeping costs show);
- page map: one vectorised page-owner snapshot (taken every N steps).

Each figure is the best of ``--repeats`` and is printed with its ratio to the
1k-page figure measured in the same run: flat ratios mean no per-step cost
grows with the pool.

    .venv/bin/python bench/radix_scale.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import common

from kvscope.app.progress import Progress
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import fill_cache, shared_stem_workload, tiny_engine

PAGE = 4  # tokens per page, as tests/test_scale.py's pools

SIZES = (1_000, 10_000, 100_000)
EVICT = 800  # fewer than the smallest pool caches


def evict_us_per_page(pages: int) -> float:
    engine = tiny_engine(pages, PAGE)
    fill_cache(engine)
    cache = engine.kv.prefix
    t0 = time.perf_counter()
    freed = 0
    while freed < EVICT:
        got = cache.evict(8)
        assert got, "the cache ran out of evictable pages"
        freed += got
    return (time.perf_counter() - t0) / freed * 1e6


def step_ms(pages: int) -> tuple[float, int]:
    engine = tiny_engine(pages, PAGE, max_batched_tokens=64)
    fill_cache(engine)
    for _, prompt, n in shared_stem_workload():
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    steps = 0
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return (time.perf_counter() - t0) / steps * 1e3, steps


def page_map_ms(pages: int) -> float:
    engine = tiny_engine(pages, PAGE)
    fill_cache(engine)
    t0 = time.perf_counter()
    engine.kv.page_owners()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="best of N per figure (default 3)")
    args = parser.parse_args()
    rows = []
    base: dict[str, float] = {}
    # One unit per (size, repeat); the 100k-page size costs most: a rough ETA.
    progress = Progress(len(SIZES) * args.repeats, "size repeats")
    for pages in SIZES:
        evicts, steps, snapshots = [], [], []
        for _ in range(args.repeats):
            evicts.append(evict_us_per_page(pages))
            steps.append(step_ms(pages))
            snapshots.append(page_map_ms(pages))
            progress.advance()
        evict = min(evicts)
        step, num_steps = min(steps)
        snapshot = min(snapshots)
        base = base or {"evict": evict, "step": step}
        rows.append(
            [
                pages,
                evict,
                evict / base["evict"],
                step,
                step / base["step"],
                num_steps,
                snapshot,
            ]
        )
    print(
        common.table(
            [
                "pages",
                "evict us/page",
                "vs 1k",
                "step ms",
                "vs 1k",
                "steps",
                "page map ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
