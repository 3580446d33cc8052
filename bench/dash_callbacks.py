"""How long each dashboard callback takes on a run of a million events.

Records a synthetic run of at least ``--events`` events (kept at ``--db`` and
reused when it is already there), then calls every callback of the app the way
the browser does: an HTTP POST to ``/_dash-update-component`` through Flask's
test client, so query, figure building and JSON encoding are all in the time.
Each page callback is timed as a full draw (the page opened, the run chosen)
and as a refresh (only the data fingerprint changed: a patch), always with new
data, so the dashboard's query cache never answers.

    .venv/bin/python bench/dash_callbacks.py [--events N] [--db PATH] [--repeats K]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import common  # sets the import path

from kvscope.app.dashboard.screenshots import DEMO_CONFIG
from kvscope.app.dashboard.server import create_app
from kvscope.app.progress import Progress
from kvscope.db.queries import fingerprint, reader
from kvscope.profiler.recorder import Recorder
from kvscope.profiler.synthetic import SyntheticRun

EVENTS_PER_REQUEST = 21.5  # what the synthetic engine emits, GPU samples on


def record(path: Path, events: int) -> int:
    """A synthetic run of at least ``events`` events, flushed in bounded batches
    (emitting it all at once would overflow the recorder's queue)."""
    recorder = Recorder(path, DEMO_CONFIG | {"bench": "dash_callbacks"}, "synthetic", "synthetic")
    run = SyntheticRun(
        recorder.start_ns,
        num_requests=int(events / EVENTS_PER_REQUEST) + 1,
        num_pages=512,
        gpu=True,
        seed=7,
    )
    for start in range(0, len(run.events), 50_000):
        for event in run.events[start : start + 50_000]:
            recorder.on_event(event)
        recorder.flush()
    recorder.finish()
    return recorder.run_id


def big_run(path: Path, events: int) -> int:
    if path.exists():
        with reader(path) as db:
            row = db.execute(
                "SELECT id FROM runs WHERE events_written >= ? ORDER BY id DESC", (events,)
            ).fetchone()
        if row:
            return row[0]
    return record(path, events)


def payload(key: str, spec: dict, values: dict, changed: list[str]) -> dict:
    def arg(dep: dict) -> dict:
        return dep | {"value": values.get(f"{dep['id']}.{dep['property']}")}

    outputs = [
        {"id": o.split(".")[0], "property": o.split(".")[1]} for o in key.strip(".").split("...")
    ]
    return {
        "output": key,
        "outputs": outputs if key.startswith("..") else outputs[0],
        "inputs": [arg(d) for d in spec["inputs"]],
        "state": [arg(d) for d in spec["state"]],
        "changedPropIds": changed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, default=Path("/tmp/kvscope-dash-bench.db"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    started = time.perf_counter()
    run_id = big_run(args.db, args.events)
    with reader(args.db) as db:
        version = fingerprint(db, run_id)
        info = db.execute("SELECT events_written FROM runs WHERE id = ?", (run_id,)).fetchone()
        (requests,) = db.execute(
            "SELECT COUNT(*) FROM requests WHERE run_id = ?", (run_id,)
        ).fetchone()
    print(
        f"run {run_id}: {info[0]:,} events, {requests:,} requests "
        f"(ready in {time.perf_counter() - started:.1f} s)"
    )

    app = create_app(args.db)
    client = app.server.test_client()
    client.get("/")  # Dash builds its callback list on the first request
    values = {
        "tick.n_intervals": 1,
        "run.value": run_id,
        "version.data": version,
        "url.pathname": "/",
        "requests-table.page_current": 0,
        "requests-table.page_size": 20,
        "requests-table.filter_query": "{status} contains finished && {ttft_s} > 0.001",
        "requests-table.sort_by": [{"column_id": "e2e_s", "direction": "desc"}],
        "requests-table.selected_row_ids": [requests // 2],
        "compare-runs.value": [run_id, run_id],
    }
    rows = []
    calls = itertools.count()
    progress = Progress(len(app.callback_map), "callbacks")  # each: its calls x --repeats
    for key, spec in app.callback_map.items():
        inputs = [f"{d['id']}.{d['property']}" for d in spec["inputs"]]
        modes = {"full": [inputs[-1]]}
        if "version.data" in inputs:
            modes["refresh"] = ["version.data"]
        for mode, changed in modes.items():
            seconds, size = [], 0
            for _ in range(args.repeats):
                # A new data version each call: the dashboard's per-version query
                # cache misses, as on every refresh of a live run.
                fresh = values | {"version.data": version | {"bench_call": next(calls)}}
                body = json.dumps(payload(key, spec, fresh, changed))
                t = time.perf_counter()
                response = client.post(
                    "/_dash-update-component", data=body, content_type="application/json"
                )
                seconds.append(time.perf_counter() - t)
                assert response.status_code in (200, 204), (key, response.status_code)
                size = len(response.data)
            name = key.strip(".").split("...")[0]
            rows.append([name, mode, statistics.median(seconds) * 1e3, max(seconds) * 1e3, size])
        progress.advance()
    rows.sort(key=lambda r: -r[2])
    print(
        common.table(
            ["callback (first output)", "call", "median ms", "max ms", "response bytes"], rows
        )
    )
    print(f"slowest: {rows[0][0]} ({rows[0][1]}), median {rows[0][2]:.0f} ms")


if __name__ == "__main__":
    main()
