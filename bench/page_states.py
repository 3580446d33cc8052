"""What an exact page map costs a reader: db.pages.step_pages at 100,000 pages.

Records real runs of the tiny engine (kvscope.engine.tiny) on a ``--pages`` pool
(100,000 by default), a shared-prefix workload of ``--requests`` requests, and
times ``step_pages`` (the newest snapshot with holders plus the page events since)
at every step. Two run lengths (the second ``--longer`` times as many requests)
show that the cost per step does not grow with the run: it is bounded by the
snapshot (O(pages)) and ``page_map_every`` steps of events. Also prints the
stored size of one snapshot's owners, holds and tree blobs, and the probe-free
baseline of one whole-pool numpy pass (``step_pages_from`` on the same holds),
measured in the same run.

    .venv/bin/python bench/page_states.py [--pages N] [--requests R] [--longer K]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from kvscope.app.progress import Progress  # noqa: E402
from kvscope.db.page_replay import step_pages  # noqa: E402
from kvscope.db.page_states import step_pages_from  # noqa: E402
from kvscope.db.source import connection  # noqa: E402
from kvscope.engine.engine import Engine  # noqa: E402
from kvscope.engine.engine_config import EngineConfig  # noqa: E402
from kvscope.engine.events import EventBus  # noqa: E402
from kvscope.engine.sampler import SamplingParams  # noqa: E402
from kvscope.engine.tiny import VOCAB, tiny_loaded  # noqa: E402
from kvscope.profiler.recorder import Recorder  # noqa: E402

BYTES_PER_PAGE = 2 * 2 * 8 * 2 * 4 * 4  # the tiny model's K+V bytes of one 4-token page


def record(path: Path, pages: int, requests: int) -> tuple[int, int]:
    """A shared-prefix run into ``path``; returns (run id, steps)."""
    bus = EventBus()
    config = EngineConfig(kv_budget_bytes=pages * BYTES_PER_PAGE, page_size=4)
    engine = Engine(config, bus=bus, loaded=tiny_loaded())
    recorder = Recorder(path, {"bench": True}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    rng = random.Random(0)
    prefix = [rng.randrange(1, VOCAB) for _ in range(64)]
    pending = [prefix + [rng.randrange(1, VOCAB) for _ in range(5)] for _ in range(requests)]
    while pending or engine.has_unfinished():
        if pending:
            engine.add_request(pending.pop(), SamplingParams(max_tokens=24, ignore_eos=True))
        engine.step()
    recorder.finish("complete")
    return recorder.run_id, engine.step_count


def time_steps(path: Path, run_id: int, steps: int) -> list[float]:
    out = []
    with connection(path) as conn:
        for step in range(steps):
            t0 = time.perf_counter()
            step_pages(conn, run_id, step)
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--longer", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        lengths = (args.requests, args.requests * args.longer)
        # One unit per run length (record, then time every step); the longer one costs
        # about --longer times as much, so the ETA after the first is an underestimate.
        progress = Progress(len(lengths), "run lengths")
        for n in lengths:
            path = Path(tmp) / f"run{n}.db"
            run_id, steps = record(path, args.pages, n)
            times = time_steps(path, run_id, steps)
            rows.append((n, steps, times))
            progress.advance()
        with connection(path) as conn:
            sizes = conn.execute(
                """SELECT AVG(LENGTH(owners)), AVG(LENGTH(holds)), AVG(LENGTH(tree))
                   FROM page_maps WHERE run_id = ?""",
                (run_id,),
            ).fetchone()
            last = step_pages(conn, run_id, steps - 1 - (steps // 2))
        t0 = time.perf_counter()
        for _ in range(20):
            step_pages_from(0, last.num_pages, last.request_pages, last.in_tree.nonzero()[0], {})
        numpy_pass = (time.perf_counter() - t0) / 20
    print(f"pool {args.pages:,} pages (page_map_every 4)")
    for n, steps, times in rows:
        ms = [t * 1e3 for t in times]
        print(
            f"  {n:4d} requests, {steps:5d} steps: step_pages median {statistics.median(ms):.2f} ms, "
            f"p99 {sorted(ms)[int(len(ms) * 0.99) - 1]:.2f} ms, max {max(ms):.2f} ms"
        )
    ratio = statistics.median(rows[1][2]) / statistics.median(rows[0][2])
    print(f"  longer run / shorter run, median per step: {ratio:.2f}x (bounded: ~1x)")
    print(f"  one step_pages_from numpy pass over the pool: {numpy_pass * 1e3:.2f} ms (baseline)")
    print(
        f"  stored per snapshot: owners {sizes[0]:,.0f} B, holds {sizes[1]:,.0f} B, "
        f"tree {sizes[2]:,.0f} B (zlib)"
    )


if __name__ == "__main__":
    main()
