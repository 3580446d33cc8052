"""How fast the recorder writes: events/s from the bus into SQLite, end to end.

Two measurements, each into a fresh database:

- burst: emit a whole event stream at once (the queue sized to hold it) and
  time until the writer thread has committed every event: the writer's
  sustained rate, conversion and inserts included, sharing the GIL with the
  emitting thread as it does in the engine (best and median of ``--repeats``,
  since a shared machine's load moves single figures a lot);
- paced: emit at a fixed rate for a few seconds with the default queue and
  report dropped events and the deepest queue seen.

Two event mixes: the synthetic engine run (request lifecycle, pages, prefix
lookups, evictions, step summaries, page maps, kernel timings) and a
kernel-heavy one (30 kernel timings per step, as with per-layer timing).

    .venv/bin/python bench/recorder_rate.py [--events N] [--repeats K] [--pace R] [--db-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.events import Event, EventBus, KernelTiming, StepSummary, now_ns  # noqa: E402
from profiler.recorder import Recorder  # noqa: E402
from profiler.synthetic import SyntheticRun  # noqa: E402


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


def _recorder(db_dir: Path, name: str, **kwargs) -> Recorder:
    path = db_dir / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return Recorder(path, {"bench": name}, "bench", "bench", hardware={}, versions={}, **kwargs)


def burst(db_dir: Path, name: str, make, n: int) -> dict:
    rec = _recorder(db_dir, f"burst-{name}", max_queue=n + 1)
    events = make(n, rec.start_ns)
    bus = EventBus()
    bus.subscribe(rec.on_event)
    rec.start()
    t0 = time.perf_counter()
    for event in events:
        bus.emit(event)
    emitted = time.perf_counter() - t0
    while rec.events_written < len(events):
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
    rec.finish()
    return {
        "events": len(events),
        "achieved_rate": len(events) / elapsed,
        "dropped": rec.dropped_events,
        "deepest_queue": deepest,
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
    parser.add_argument("--db-dir", type=Path, help="where the databases go (default a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db_dir = args.db_dir or Path(tmp)
        for name, make in (("synthetic", synthetic_mix), ("kernels", kernel_mix)):
            runs = sorted(
                (burst(db_dir, name, make, args.events) for _ in range(args.repeats)),
                key=lambda b: b["events_per_s"],
            )
            b = runs[-1]
            print(
                f"burst  {name:<9} {b['events']:>8} events: best {b['events_per_s']:>9,.0f} events/s "
                f"written, median {runs[len(runs) // 2]['events_per_s']:,.0f} "
                f"(emit {b['emit_us_per_event']:.2f} us/event, {b['bytes_per_event']:.0f} B/event, "
                f"dropped {sum(r['dropped'] for r in runs)})"
            )
            p = paced(db_dir, name, make, args.pace, args.seconds)
            print(
                f"paced  {name:<9} {p['events']:>8} events at {p['achieved_rate']:>9,.0f} events/s: "
                f"dropped {p['dropped']}, deepest queue {p['deepest_queue']}"
            )


if __name__ == "__main__":
    main()
