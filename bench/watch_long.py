"""How long every watch view takes to refresh as a watched session grows.

Builds the database of an hour of a busy fleet (issue 23): 8 data-parallel
ranks of one vLLM deployment, prefill-like batches (a request stores its
uncached blocks as one parent-chained ``BlockStored``), system prompts shared
by every rank, multi-turn sessions that come back (to their own rank, or to
another one: a routing miss), LRU eviction at a fixed capacity per rank (so
returning sessions are recomputed after eviction) and a few prefix-cache
resets. Rows are generated directly and written through ``WatchWriter`` (the
recorder's own writer, aggregates included), not over sockets, so a 4M-event
database takes seconds, not an hour. Each database is kept at
``--dir``/watch-long-<events>.db and reused.

Then, in a fresh process per size (its peak RSS is what a dashboard process
holding that view would need), it times every watch view's refresh: the
dashboard's watch callback through Flask's test client (as the browser calls
it), the TUI's ``WatchView`` refresh (snapshot and render) and
``kvscope report --format html``.

    .venv/bin/python bench/watch_long.py [--events 500000,1000000,2000000,4000000]
    .venv/bin/python bench/watch_long.py --removals   # a removal's cost past the memory's bound
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import common  # sets the import path

from kvscope.app.progress import Progress
from kvscope.db.store import open_db
from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import EVENTS_SOURCE, METRICS_SOURCE, OP_CLEARED, OP_REMOVED, OP_STORED
from kvscope.db.writer import create_run
from kvscope.profiler.watch.writer import WatchWriter

RANKS = 8
CAPACITY = 30_000  # GPU blocks per rank
BLOCK_SIZE = 16
PREFIXES = 48  # system prompts shared by every rank
FLEET_RATE = 1_150  # block events/s of the whole fleet: 4.1M is about an hour
GENERATOR = 5  # bump when the generated stream changes (the kept files are rebuilt)


def _hash(rng: random.Random) -> int:
    return rng.getrandbits(64) - 2**63  # stored signed, as the recorder does


class Fleet:
    """The 8 ranks' LRU caches and the sessions that come back to them."""

    def __init__(self, seed: int = 23) -> None:
        self.rng = rng = random.Random(seed)
        self.caches = [OrderedDict() for _ in range(RANKS)]
        self.prefixes = [[_hash(rng) for _ in range(rng.randint(8, 32))] for _ in range(PREFIXES)]
        self.sessions: list[tuple[int, list[int]]] = []  # (home rank, chain)
        self.seq = [0] * RANKS
        self.block_events = 0

    def request(self, rank: int, events: list[tuple]) -> None:
        """One request on ``rank``: its chain's uncached blocks stored, LRU evicted."""
        rng = self.rng
        i = self._returning(rank) if self.sessions and rng.random() < 0.45 else None
        if i is not None:
            home, chain = self.sessions[i]
            chain = chain + [_hash(rng) for _ in range(rng.randint(2, 12))]
            self.sessions[i] = (home, chain)
        else:
            chain = self.prefixes[rng.randrange(PREFIXES)] + [
                _hash(rng) for _ in range(rng.randint(4, 40))
            ]
            self.sessions.append((rank, chain))
            if len(self.sessions) > 4000:
                self.sessions.pop(rng.randrange(len(self.sessions)))
        cache = self.caches[rank]
        run: list[int] = []
        parent = None
        for position, block in enumerate(chain):
            if block in cache:
                cache.move_to_end(block)
                if run:
                    events.append((OP_STORED, run, parent))
                    run = []
                continue
            if not run:
                parent = chain[position - 1] if position else None
            run.append(block)
            cache[block] = None
        if run:
            events.append((OP_STORED, run, parent))
        evicted = []
        while len(cache) > CAPACITY:
            evicted.append(cache.popitem(last=False)[0])
        for start in range(0, len(evicted), 16):
            events.append((OP_REMOVED, evicted[start : start + 16], None))

    def _returning(self, rank: int) -> int | None:
        """A session coming back, served by ``rank``: mostly one whose home it is (the
        router keeps a session on its rank), one in five wherever it lives (a routing
        miss when that is another rank); None: a new session instead."""
        rng = self.rng
        if rng.random() < 0.2:
            return rng.randrange(len(self.sessions))
        for _ in range(24):
            i = rng.randrange(len(self.sessions))
            if self.sessions[i][0] == rank:
                return i
        return None

    def batches(self, total: int, resets: int = 3):
        """(source, seq, ts_s, events) per rank step until ``total`` block events."""
        reset_at = {total * (k + 1) // (resets + 1) for k in range(resets)}
        next_reset = sorted(reset_at)
        while self.block_events < total:
            rank = self.rng.randrange(RANKS)
            events: list[tuple] = []
            if next_reset and self.block_events >= next_reset[0]:
                next_reset.pop(0)
                self.caches[rank].clear()
                events.append((OP_CLEARED, [], None))
            for _ in range(self.rng.randint(1, 3)):
                self.request(rank, events)
            self.block_events += sum(len(e[1]) for e in events)
            self.seq[rank] += 1
            yield rank, self.seq[rank], self.block_events / FLEET_RATE, events


def build(path: Path, total: int) -> int:
    """Write the session's database; returns its run id."""
    path.unlink(missing_ok=True)
    db = open_db(path)
    start_ns = 10**12
    run_id = create_run(
        db,
        kind="watch",
        model="bench/llama-8b",
        config={"bench": "watch_long", "events": total, "generator": GENERATOR},
        hardware={},
        versions={},
        started_at=time.time(),
        start_ns=start_ns,
    )
    writer = WatchWriter(db, run_id)
    metrics_source = RANKS
    first = WatchBatch(
        sources=[
            (r, EVENTS_SOURCE, "vllm", f"tcp://node:{5557 + r}", None, "kv", r, 0)
            for r in range(RANKS)
        ]
        + [
            (
                metrics_source,
                METRICS_SOURCE,
                "vllm",
                "http://node:8000/metrics",
                None,
                None,
                None,
                0,
            )
        ]
    )
    writer.write(first)
    fleet = Fleet()
    batch = WatchBatch()
    counters = [[0, 0, 0] for _ in range(RANKS)]  # batches, events, block events
    next_scrape = 0.0
    flush_every = 2000  # the recorder's flush_at
    for n, (rank, seq, ts_s, events) in enumerate(fleet.batches(total), 1):
        ts_ns = start_ns + int(ts_s * 1e9)
        for op, hashes, parent in events:
            text = repr(hashes).replace(" ", "") if hashes else None
            batch.blocks.append(
                (rank, seq, ts_ns, op, text, parent, None if op == OP_CLEARED else "GPU",
                 None if op == OP_CLEARED else 0, len(hashes))
            )  # fmt: skip
        c = counters[rank]
        c[0] += 1
        c[1] += len(events)
        c[2] += sum(len(e[1]) for e in events)
        while ts_s >= next_scrape:  # one /metrics scrape a second
            used = sum(len(cache) for cache in fleet.caches) / (RANKS * CAPACITY)
            t = start_ns + int(next_scrape * 1e9)
            batch.metrics += [
                (metrics_source, t, "vllm:kv_cache_usage_perc", 'engine="0"', used),
                (metrics_source, t, "vllm:num_requests_running", 'engine="0"', 24.0),
                (metrics_source, t, "vllm:prefix_cache_queries_total", 'engine="0"', next_scrape * 9e3),
                (metrics_source, t, "vllm:prefix_cache_hits_total", 'engine="0"', next_scrape * 4e3),
            ]  # fmt: skip
            next_scrape += 1.0
        if n % flush_every == 0:
            batch.counters = _counters(counters, fleet)
            writer.write(batch)
            batch = WatchBatch()
    batch.counters = _counters(counters, fleet)
    writer.write(batch)
    writer.finish("complete", 0)
    db.conn.close()
    return run_id


def _counters(counters: list[list[int]], fleet: Fleet) -> list[tuple]:
    attrs = json.dumps(
        {"kv_cache_spec_kinds": ["full_attention"], "lora_names": [], "media": ["GPU"]}
    )
    return [
        (BLOCK_SIZE, fleet.seq[r], c[0], c[1], c[2], 0, 0, 0, 0, 0, 0, attrs, r)
        for r, c in enumerate(counters)
    ]


def database(directory: Path, total: int) -> tuple[Path, float | None]:
    path = directory / f"watch-long-{total}.db"
    if path.exists():
        db = open_db(path, create=False)
        try:
            row = db.execute("SELECT config FROM runs WHERE kind = 'watch'").fetchone()
        finally:
            db.conn.close()
        if row and json.loads(row[0]).get("generator") == GENERATOR:
            return path, None
    t = time.perf_counter()
    build(path, total)
    return path, time.perf_counter() - t


# --- the views, timed in their own process --------------------------------------------


def time_views(path: Path, repeats: int) -> dict:
    from kvscope.app.dashboard.server import create_app
    from kvscope.app.report.html import build_html
    from kvscope.app.tui import watch_view
    from kvscope.db.queries import fingerprint, reader

    with reader(path) as db:
        run_id = db.execute("SELECT id FROM runs WHERE kind = 'watch'").fetchone()[0]
        version = fingerprint(db, run_id)
    out: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        seconds = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - t)
        out[name] = min(seconds)
        out[name + " max"] = max(seconds)

    calls = iter(range(10**6))

    def dash_client():
        app = create_app(path)
        client = app.server.test_client()
        client.get("/")
        key = next(k for k in app.callback_map if "watch-content.children" in k)
        return client, key, app.callback_map[key]

    def post(client, key, spec) -> None:
        # A new data version each call: what a live watch's refresh sees.
        fresh = {"version.data": version | {"bench_call": next(calls)}, "run.value": run_id}
        inputs = [d | {"value": fresh.get(f"{d['id']}.{d['property']}")} for d in spec["inputs"]]
        body = {
            "output": key,
            "outputs": {"id": "watch-content", "property": "children"},
            "inputs": inputs,
            "state": [],
            "changedPropIds": ["version.data"],
        }
        response = client.post(
            "/_dash-update-component", data=json.dumps(body), content_type="application/json"
        )
        assert response.status_code == 200, response.status_code

    clients = [dash_client() for _ in range(repeats)]  # a fresh server each: nothing cached
    seconds = []
    for client, key, spec in clients:
        t = time.perf_counter()
        post(client, key, spec)
        seconds.append(time.perf_counter() - t)
    out["dashboard watch callback"] = min(seconds)
    out["dashboard watch callback max"] = max(seconds)
    # The same server again with nothing written since: the per-version cache answers.
    timed("dashboard refresh, nothing new", lambda: post(*clients[0]))

    def tui_refresh() -> None:
        view = watch_view.WatchView(path, run_id)
        snap = watch_view.snapshot(path, run_id)
        view.snapshot = snap
        watch_view.render(snap)

    timed("TUI WatchView refresh", tui_refresh)

    def report() -> None:
        with reader(path) as db:
            build_html(db, run_id)

    timed("report --format html", report)
    # VmHWM, not ru_maxrss: Linux keeps the parent's high-water mark across exec.
    with open("/proc/self/status") as f:
        hwm = next(line for line in f if line.startswith("VmHWM:"))
    out["peak RSS MiB"] = int(hwm.split()[1]) / 1024
    return out


def removal_cost(chunk: int = 200_000) -> None:
    """Per-removal cost as the fleet's memory of removed hashes fills to its bound
    (``EVICTED_MEMORY``) and forgets its oldest: flat, where the replay's dict had
    made each removal 40-620 us past 1M (issue 23)."""
    from kvscope.profiler.watch.fold import WatchFold
    from kvscope.profiler.watch.fold.removal_memory import EVICTED_MEMORY

    state = WatchFold(1, 0)
    state.add_source(0, "vllm")
    # Two chunks past the bound, so the last ones pay for forgetting.
    for k in range(EVICTED_MEMORY // chunk + 2):
        hashes = list(range(k * chunk, (k + 1) * chunk))
        state.apply([(0, 0, k, OP_STORED, None, None, "GPU", 0, chunk)], [hashes])
        t = time.perf_counter()
        state.apply([(0, 0, k, OP_REMOVED, None, None, "GPU", 0, chunk)], [hashes])
        us = (time.perf_counter() - t) / chunk * 1e6
        remembered = len(state.sources[0].evicted)
        print(f"removals {k * chunk:>9,} to {(k + 1) * chunk:,}: {us:.2f} us each "
              f"(remembered {remembered:,})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", default="500000,1000000,2000000,4000000")
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--views", type=Path, help=argparse.SUPPRESS)  # the child process
    parser.add_argument(
        "--removals", action="store_true", help="only the per-removal cost past the removals bound"
    )
    args = parser.parse_args()
    if args.removals:
        removal_cost()
        return
    if args.views:
        print(json.dumps(time_views(args.views, args.repeats)))
        return
    rows = []
    sizes = [int(n) for n in args.events.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)  # where the databases are built and kept
    # One unit per size (build or reuse its database, then time the views); sizes
    # usually double, so the ETA from the mean is an underestimate until the last.
    progress = Progress(len(sizes), "sizes")
    for total in sizes:
        path, built_s = database(args.dir, total)
        note = "kept" if built_s is None else f"built in {built_s:.1f} s"
        print(f"{total:,} block events: {path} ({note}, {path.stat().st_size / 2**20:,.0f} MiB)")
        child = subprocess.run(
            [sys.executable, __file__, "--views", str(path), "--repeats", str(args.repeats)],
            capture_output=True,
            text=True,
            env=os.environ | {"PYTHONWARNINGS": "ignore"},
        )
        if child.returncode:
            sys.exit(child.stderr)
        figures = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append(
            [
                f"{total:,}",
                *(
                    f"{figures[name]:.3f}-{figures[name + ' max']:.3f}"
                    for name in (
                        "dashboard watch callback",
                        "dashboard refresh, nothing new",
                        "TUI WatchView refresh",
                        "report --format html",
                    )
                ),
                figures["peak RSS MiB"],
            ]
        )
        print("  " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()), flush=True)
        progress.advance()
    print(
        common.table(
            [
                "block events",
                "dashboard s",
                "dashboard, nothing new s",
                "TUI refresh s",
                "report html s",
                "peak RSS MiB",
            ],
            rows,
        )  # fmt: skip
    )
    print("(min-max of the repeats; the dashboard's from a fresh server each, nothing cached)")
    slowest = max(float(cell.split("-")[1]) for row in rows for cell in row[1:5])
    print(f"slowest view refresh: {slowest:.2f} s (goal <= 1 s at 4M, within 1.5x of that at 1M)")


if __name__ == "__main__":
    main()
