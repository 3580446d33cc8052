"""The recorder: never blocks, never loses events silently, survives SIGKILL and Ctrl-C."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvscope.db import queries
from kvscope.db.schema import FAILED, INCOMPLETE, INTERRUPTED
from kvscope.db.store import open_db
from kvscope.engine.events import AllBlocksCleared, EventBus, PageMap, PrefixLookup, now_ns
from kvscope.profiler.recorder import Recorder
from kvscope.profiler.synthetic import SyntheticRun

# A process that records prefix lookups numbered 0, 1, 2... until it is killed.
EMITTER = """
import sys, time
from kvscope.engine.events import EventBus, PrefixLookup, now_ns
from kvscope.profiler.recorder import Recorder

rec = Recorder(sys.argv[1], {}, "emitter", hardware={}, versions={}, flush_interval_s=0.1)
bus = EventBus()
bus.subscribe(rec.on_event)
n = 0
try:
    with rec:
        print(rec.run_id, flush=True)
        while True:
            for _ in range(100):
                bus.emit(PrefixLookup(now_ns(), n, n, 10, 4))
                n += 1
            time.sleep(0.005)
except KeyboardInterrupt:
    print(n, flush=True)
"""

READER = """
import json, sys, time
from kvscope.db import queries

path, run_id, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
errors, steps = [], []
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        queries.run_summary(path, run_id)
        queries.step_series(path, run_id, max_points=100)
        queries.page_maps(path, run_id, max_snapshots=20)
        queries.event_timeline(path, run_id, limit=50)
        steps.append(queries.latest_step(path, run_id).step)
    except Exception as exc:
        errors.append(repr(exc))
print(json.dumps({"errors": errors, "steps": steps}))
"""


def _python(script: str, *args: object, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _recorder(path: Path, **kwargs) -> Recorder:
    return Recorder(path, {"test": True}, "m", hardware={}, versions={}, **kwargs)


def _lookup_ids(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT request_id FROM events ORDER BY id")]


def _events_written(path: Path, run_id: int) -> int:
    try:
        return queries.latest_step(path, run_id).events_written
    except Exception:
        return 0  # not created yet


def test_sigkill_leaves_an_incomplete_run_holding_every_flushed_event(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    child = _python(EMITTER, path)
    run_id = int(child.stdout.readline())
    deadline = time.monotonic() + 10
    while _events_written(path, run_id) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    killed_ns = now_ns()
    child.send_signal(signal.SIGKILL)
    child.wait()

    db = open_db(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    ids = _lookup_ids(path)
    assert len(ids) >= 2000
    assert ids == list(range(len(ids)))  # a prefix of what was emitted: nothing skipped
    last_ns = db.execute("SELECT MAX(ts_ns) FROM events").fetchone()[0]
    assert killed_ns - last_ns < 1.0e9  # at most about a second lost
    summary = queries.run_summary(db, run_id)
    assert summary.status == INCOMPLETE
    assert summary.prefix_hit_tokens == 4 * len(ids)
    assert queries.list_runs(db)[0].status == INCOMPLETE
    db.conn.close()


def test_ctrl_c_finishes_cleanly_as_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    child = _python(EMITTER, path)
    run_id = int(child.stdout.readline())
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=20)
    assert child.returncode == 0
    emitted = int(out.split()[-1])
    ids = _lookup_ids(path)
    # Every event emitted before the interrupt is in (the one being emitted may be too).
    assert len(ids) in (emitted, emitted + 1) and ids == list(range(len(ids)))
    run = queries.run_info(path, run_id)
    assert run.status == INTERRUPTED and run.dropped_events == 0


def test_reader_process_sees_no_lock_errors_while_the_writer_writes(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    rec = _recorder(path, flush_interval_s=0.02)
    bus = EventBus()
    bus.subscribe(rec.on_event)
    rec.start()
    run = SyntheticRun(rec.start_ns, num_requests=1500, num_pages=128, seed=2)
    reader = _python(READER, path, rec.run_id, 2.0)
    started = time.monotonic()
    events = run.events
    for i in range(0, len(events), 300):
        for event in events[i : i + 300]:
            bus.emit(event)
        time.sleep(max(0.0, (i / len(events)) * 2.0 - (time.monotonic() - started)))
    out, _ = reader.communicate(timeout=30)
    rec.finish()
    result = json.loads(out)
    assert result["errors"] == []
    steps = [s for s in result["steps"] if s is not None]
    assert len(result["steps"]) >= 10
    assert steps and steps[-1] > steps[0]  # the reader watched the run grow


def test_overflow_is_counted_and_stored(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    rec = _recorder(path, max_queue=10)
    for i in range(25):
        rec.on_event(PrefixLookup(now_ns(), 0, i, 8, 8))
    assert rec.dropped_events == 15
    summary = rec.finish()
    assert summary.dropped_events == 15
    assert queries.run_info(path, rec.run_id).dropped_events == 15
    assert _lookup_ids(path) == list(range(10))


def test_failed_write_counts_its_events_as_dropped(tmp_path: Path, monkeypatch) -> None:
    rec = _recorder(tmp_path / "k.db")
    real_write = rec._writer.write

    def full_disk(batch, dropped_events=0):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(rec._writer, "write", full_disk)
    for i in range(7):
        rec.on_event(PrefixLookup(now_ns(), 0, i, 8, 8))
    assert rec.flush() == 0
    assert rec.dropped_events == 7
    assert isinstance(rec.error, sqlite3.OperationalError)
    monkeypatch.setattr(rec._writer, "write", real_write)
    rec.on_event(AllBlocksCleared(now_ns(), 1))
    assert rec.finish().dropped_events == 7


def _seconds_until_written(path: Path, n: int, limit_s: float = 5.0) -> float:
    t0 = time.monotonic()
    while len(_lookup_ids(path)) < n and time.monotonic() - t0 < limit_s:
        time.sleep(0.01)
    return time.monotonic() - t0


def test_background_thread_flushes_on_time_and_when_the_queue_fills(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    rec = _recorder(path, flush_interval_s=0.25, flush_at=10_000)
    rec.start()
    for i in range(10):
        rec.on_event(PrefixLookup(now_ns(), 0, i, 8, 8))
    assert _seconds_until_written(path, 10) < 1.0  # by the timer
    rec.finish()

    path = tmp_path / "k2.db"
    rec = _recorder(path, flush_interval_s=30.0, flush_at=100)
    rec.start()
    time.sleep(0.05)
    for i in range(150):
        rec.on_event(PrefixLookup(now_ns(), 0, i, 8, 8))
    # Woken by the queue's length: the timer would take 30 s.
    assert _seconds_until_written(path, 100) < 5.0
    rec.finish()


def test_context_manager_marks_failures(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with pytest.raises(ValueError), _recorder(path) as rec:
        rec.on_event(PageMap(now_ns(), 0, np.zeros(4, dtype=np.int32)))
        raise ValueError("engine bug")
    assert queries.run_info(path, rec.run_id).status == FAILED
    assert queries.page_map_at(path, rec.run_id, 0).pages_owned == 4


def test_numpy_values_in_events_are_stored_as_numbers(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    rec = _recorder(path)
    rec.on_event(PrefixLookup(now_ns(), np.int64(3), np.int64(7), np.int32(16), np.int64(8)))
    rec.finish()
    (event,) = queries.event_timeline(path, rec.run_id, kinds=["prefix_lookup"])
    assert (event.step, event.request_id, event.payload["hit_tokens"]) == (3, 7, 8)
    assert queries.run_summary(path, rec.run_id).prefix_hit_rate == 0.5


def test_finish_is_idempotent_and_late_events_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with _recorder(path) as rec:
        rec.on_event(PrefixLookup(now_ns(), 0, 0, 8, 8))
        first = rec.finish(INTERRUPTED)
    assert rec.finish() is first  # __exit__'s finish changes nothing
    assert queries.run_info(path, rec.run_id).status == INTERRUPTED
    rec.on_event(PrefixLookup(now_ns(), 1, 1, 8, 8))
    assert rec.queued == 0 and rec.dropped_events == 1
    with pytest.raises(ValueError, match="final status"):
        _recorder(tmp_path / "k2.db").finish("done")
