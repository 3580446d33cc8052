"""The background checkpointer: a commit's WAL pages reach the database file
beside the writing, so neither the writer's commits nor the last close copy them."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvscope.db.checkpointer import Checkpointer
from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_STORED
from kvscope.profiler.watch.writer import WatchWriter

from support.watch_helpers import new_watch_run, wait_until


@contextmanager
def _writing(path: Path, **checkpointer) -> Iterator[tuple[sqlite3.Connection, Checkpointer]]:
    """A WAL writer's connection that never checkpoints itself, and a Checkpointer of
    its file (both closed after)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = wal")
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # only the checkpointer copies
    conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    cp = Checkpointer(path, **checkpointer)
    try:
        yield conn, cp
    finally:
        cp.close()
        conn.close()


def _commit(conn: sqlite3.Connection, rows: int) -> None:
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t VALUES (?, ?)", ((i, "x" * 100) for i in range(rows)))
    conn.execute("COMMIT")


def _file_bytes(path: Path) -> int:
    """The database file's own size: WAL pages not yet copied are not in it."""
    return path.stat().st_size


def test_a_large_commit_is_copied_into_the_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with _writing(path, large_rows=1000, interval_s=60.0) as (conn, cp):
        _commit(conn, 20_000)
        assert _file_bytes(path) < 100_000  # the commit's 2+ MB are in the WAL only
        cp.committed(20_000)
        wait_until(lambda: cp.checkpoints >= 1)
        assert _file_bytes(path) > 2_000_000  # copied into the file


def test_small_commits_wait_for_the_interval_then_are_copied(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with _writing(path, large_rows=1_000_000, interval_s=0.3) as (conn, cp):
        _commit(conn, 2000)
        cp.committed(2000)
        time.sleep(0.1)
        assert cp.checkpoints == 0 and _file_bytes(path) < 100_000  # not yet: small
        wait_until(lambda: cp.checkpoints >= 1)
        assert _file_bytes(path) > 200_000
        idle = cp.checkpoints
        time.sleep(0.7)
        assert cp.checkpoints == idle  # nothing committed since: no checkpoint
        start = time.monotonic()
        cp.close()
        assert time.monotonic() - start < 1.0  # close does not wait out the interval


def test_a_watch_writer_leaves_the_close_only_the_last_commit(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    db, run_id = new_watch_run(path)
    writer = WatchWriter(db, run_id)
    source = (0, "events", "vllm", "tcp://a:1", None, "", None, 0)
    rows = [
        (0, seq, 1_000 + seq, OP_STORED, f"[{seq}]", None, None, None, 1) for seq in range(5000)
    ]
    before = _file_bytes(path)
    writer.write(WatchBatch(sources=[source], blocks=rows))
    wait_until(lambda: writer._checkpointer.checkpoints >= 1)
    assert _file_bytes(path) > before + 100_000  # the batch's pages are in the file
    writer.finish("complete", 0)
    assert writer._checkpointer is None  # stopped with the run
    db.conn.close()
    (blocks,) = sqlite3.connect(path).execute("SELECT COUNT(*) FROM watch_blocks").fetchone()
    assert blocks == 5000
