"""How fast the recorder writes: events/s from the bus into SQLite, end to end.

Two measurements, each into a fresh database:

- burst: emit a whole event stream at once (the queue sized to hold it) and
  time until the writer thread has committed every event: the writer's
  sustained rate, conversion and inserts included, sharing the GIL with the
  emitting thread as it does in the engine (best and median of ``--repeats``,
  since a shared machine's load moves single figures a lot);
- paced: emit at a fixed rate for a few seconds with the default queue and
  report dropped events and the deepest queue seen.

Three event mixes: the synthetic engine run (request lifecycle, pages,
prefix lookups, evictions, step summaries, page maps, kernel timings), a
kernel-heavy one (30 kernel timings per step, as with per-layer timing), and
GPU scale: a ``--pages`` pool (100,000 by default; an 8B-shape run on one
H200 has about 55,000) whose page map is snapshotted every 4th step, each
step also bringing a step summary, two kernel timings and page alloc/free
events. The GPU-scale mix is paced in steps per second (``--steps-per-s``,
1,000 by default) and reports the page map's stored (compressed) size.

    .venv/bin/python bench/recorder_rate.py [--events N] [--repeats K] [--pace R]
        [--steps-per-s S] [--pages P] [--db-dir DIR]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import numpy as np  # noqa: E402

from kvscope.app.progress import Progress  # noqa: E402
from kvscope.db.schema import PAGE_MAP_COLUMNS  # noqa: E402
from kvscope.engine.events import (  # noqa: E402
    PAGE_CACHED,
    PAGE_FREE,
    Event,
    EventBus,
    KernelTiming,
    PageMap,
    PagesAllocated,
    PagesFreed,
    StepSummary,
    now_ns,
)
from kvscope.profiler.recorder import Recorder, to_batch  # noqa: E402
from kvscope.profiler.synthetic import SyntheticRun  # noqa: E402


def synthetic_mix(n: int, start_ns: int) -> list[Event]:
    run = SyntheticRun(start_ns, num_requests=max(1, n // 19), num_pages=256, seed=1)
    return run.events[:n]


def kernel_mix(n: int, start_ns: int) -> list[Event]:
    events: list[Event] = []
    step = 0
    ts = start_ns
    while len(events) < n:
        for layer in range(30):
            events.append(
                KernelTiming(ts, step, "paged_decode", f"[8,9,64] L{layer}", 1e-5, 2e6, 1e5)
            )
        events.append(StepSummary(ts, step, 8, 0, 8, 8, 0, 512, 100, 20, 392, 16, 1500, 0, 0.02))
        step += 1
        ts += 20_000_000
    return events[:n]


PAGE_MAP_EVERY = 4
GPU_EVENTS_PER_STEP = 5 + 1 / PAGE_MAP_EVERY


def page_maps(num_pages: int, variants: int = 8, seed: int = 1) -> list[np.ndarray]:
    """Owner arrays as a long-running engine leaves them: ~250 running requests holding
    runs of pages scattered by LIFO reuse, cached and free runs between them."""
    rng = np.random.default_rng(seed)
    maps = []
    for v in range(variants):
        owners = np.empty(num_pages, dtype=np.int32)
        lengths = rng.integers(1, 33, size=num_pages // 8)
        kinds = rng.choice(
            np.array([PAGE_FREE, PAGE_CACHED, 0]), size=len(lengths), p=[0.1, 0.2, 0.7]
        )
        rids = np.where(kinds == 0, 1000 * v + rng.integers(0, 250, size=len(lengths)), kinds)
        owners[:] = np.repeat(rids, lengths)[:num_pages]
        maps.append(owners)
    return maps


def gpu_scale_mix(n: int, start_ns: int, num_pages: int, step_ns: int) -> list[Event]:
    maps = page_maps(num_pages)  # shared by reference, as memory allows
    events: list[Event] = []
    step = 0
    while len(events) < n:
        ts = start_ns + step * step_ns
        events.append(PagesAllocated(ts, step, step % 256, (step % num_pages,)))
        events.append(KernelTiming(ts, step, "prefill", "[512,32,128] layers=32", 4e-4, 1e12, 1e9))
        events.append(
            KernelTiming(ts, step, "paged_decode", "[128,32,128] layers=32", 3e-4, 1e9, 2e9)
        )
        if step % PAGE_MAP_EVERY == 0:
            events.append(PageMap(ts, step, maps[step // PAGE_MAP_EVERY % len(maps)]))
        events.append(PagesFreed(ts, step, (step - 1) % 256, ((step - 1) % num_pages,)))
        used = int(num_pages * 0.9)
        events.append(
            StepSummary(
                ts,
                step,
                128,
                512,
                127,
                128,
                4,
                num_pages,
                used,
                num_pages // 5,
                num_pages - used,
                16,
                used * 15,
                0,
                step_ns / 1e9,
            )
        )
        step += 1
    return events[:n]


def page_map_blob(num_pages: int) -> tuple[int, int]:
    """(raw, stored) bytes of one page map, through the recorder's own conversion."""
    owners = page_maps(num_pages, variants=1)[0]
    blob = to_batch([PageMap(0, 0, owners)]).page_maps[0][PAGE_MAP_COLUMNS.index("owners")]
    return owners.nbytes, len(blob)


def _recorder(db_dir: Path, name: str, **kwargs) -> Recorder:
    path = db_dir / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return Recorder(path, {"bench": name}, "bench", "bench", hardware={}, versions={}, **kwargs)


def burst(db_dir: Path, name: str, make, n: int) -> dict:
    # Room for the whole stream (the GPU-scale mix shares its few page-map arrays).
    rec = _recorder(db_dir, f"burst-{name}", max_queue=n + 1, max_queue_bytes=1 << 40)
    events = make(n, rec.start_ns)
    bus = EventBus()
    bus.subscribe(rec.on_event)
    rec.start()
    t0 = time.perf_counter()
    for event in events:
        bus.emit(event)
    emitted = time.perf_counter() - t0
    while rec.events_written + rec.dropped_events < len(events):
        time.sleep(0.001)
    seconds = time.perf_counter() - t0
    rec.finish()
    size = sum(p.stat().st_size for p in db_dir.glob(f"burst-{name}.db*"))
    return {
        "events": len(events),
        "seconds": seconds,
        "events_per_s": len(events) / seconds,
        "emit_us_per_event": emitted / len(events) * 1e6,
        "bytes_per_event": size / len(events),
        "dropped": rec.dropped_events,
    }


def paced(db_dir: Path, name: str, make, rate: float, seconds: float) -> dict:
    rec = _recorder(db_dir, f"paced-{name}")
    events = make(int(rate * seconds), now_ns())
    bus = EventBus()
    bus.subscribe(rec.on_event)
    rec.start()
    slice_n = max(1, int(rate / 100))  # emit in 10 ms slices
    deepest = 0
    t0 = time.perf_counter()
    for i in range(0, len(events), slice_n):
        for event in events[i : i + slice_n]:
            bus.emit(event)
        deepest = max(deepest, rec.queued)
        time.sleep(max(0.0, t0 + (i + slice_n) / rate - time.perf_counter()))
    elapsed = time.perf_counter() - t0
    t1 = time.perf_counter()
    rec.finish()
    size = sum(p.stat().st_size for p in db_dir.glob(f"paced-{name}.db*"))
    return {
        "events": len(events),
        "achieved_rate": len(events) / elapsed,
        "dropped": rec.dropped_events,
        "deepest_queue": deepest,
        "drain_s": time.perf_counter() - t1,  # writer lag behind the last event
        "db_mb_per_s": size / elapsed / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--events", type=int, default=400_000, help="events per burst (default 400k)"
    )
    parser.add_argument(
        "--pace", type=float, default=200_000, help="paced rate, events/s (default 200k)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="bursts per mix (default 3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="paced duration (default 3 s)")
    parser.add_argument(
        "--steps-per-s", type=float, default=1000, help="GPU-scale mix pace (default 1,000)"
    )
    parser.add_argument(
        "--pages", type=int, default=100_000, help="GPU-scale pool size (default 100k)"
    )
    parser.add_argument("--db-dir", type=Path, help="where the databases go (default a temp dir)")
    args = parser.parse_args()
    gpu = functools.partial(
        gpu_scale_mix, num_pages=args.pages, step_ns=int(1e9 / args.steps_per_s)
    )
    gpu_rate = args.steps_per_s * GPU_EVENTS_PER_STEP
    with tempfile.TemporaryDirectory() as tmp:
        db_dir = args.db_dir or Path(tmp)
        # The GPU-scale burst is the paced run's events (page maps make big databases).
        mixes = (
            ("synthetic", synthetic_mix, args.pace, args.events),
            ("kernels", kernel_mix, args.pace, args.events),
            ("gpu-scale", gpu, gpu_rate, int(gpu_rate * args.seconds)),
        )
        # One unit per burst and per paced run.
        progress = Progress(len(mixes) * (args.repeats + 1), "bursts and paced runs")
        for name, make, rate, n in mixes:
            runs = []
            for _ in range(args.repeats):
                runs.append(burst(db_dir, name, make, n))
                progress.advance()
            runs.sort(key=lambda b: b["events_per_s"])
            b = runs[-1]
            print(
                f"burst  {name:<9} {b['events']:>8} events: best {b['events_per_s']:>9,.0f} events/s "
                f"written, median {runs[len(runs) // 2]['events_per_s']:,.0f} "
                f"(emit {b['emit_us_per_event']:.2f} us/event, {b['bytes_per_event']:.0f} B/event, "
                f"dropped {sum(r['dropped'] for r in runs)})"
            )
            p = paced(db_dir, name, make, rate, args.seconds)
            progress.advance()
            print(
                f"paced  {name:<9} {p['events']:>8} events at {p['achieved_rate']:>9,.0f} events/s: "
                f"dropped {p['dropped']}, deepest queue {p['deepest_queue']}, "
                f"drained {p['drain_s']:.2f} s after the last event, "
                f"database {p['db_mb_per_s']:.1f} MB per second of run"
            )
        raw, stored = page_map_blob(args.pages)
        print(
            f"gpu-scale: {args.steps_per_s:,.0f} steps/s x {GPU_EVENTS_PER_STEP} events/step, "
            f"page map of {args.pages:,} pages every {PAGE_MAP_EVERY} steps: "
            f"{raw / 1e3:,.0f} kB raw, {stored / 1e3:,.0f} kB stored "
            f"({stored * args.steps_per_s / PAGE_MAP_EVERY / 1e6:,.1f} MB/s of page maps)"
        )


if __name__ == "__main__":
    main()
