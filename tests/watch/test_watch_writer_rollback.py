"""A watch transaction that fails after its rows were folded into the in-memory
aggregates (profiler.watch.writer): SQLite rolls the rows back, and the next write must
not store aggregates of them. The failure is real: a trigger makes the
transaction's last statement fail, as a full disk would at its end."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kvscope.db.schema import COMPLETE
from kvscope.db.watch_aggregates import AGGREGATE_TABLES
from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_REMOVED, OP_STORED
from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.fold import fold_run
from kvscope.profiler.watch.writer import WatchWriter

from support.watch_helpers import new_watch_run

AGGREGATES = AGGREGATE_TABLES
SOURCES = [
    (0, "events", "vllm", "tcp://a:1", None, "", None, 0),
    (1, "events", "vllm", "tcp://b:1", None, "", None, 0),
]


def _blocks(first_seq: int, t_s: int, stored: list[int], removed: list[int], source: int = 0):
    rows = [(source, first_seq, t_s * 10**9, OP_STORED, str(stored), None, "GPU", 0, len(stored))]
    if removed:
        rows.append(
            (source, first_seq + 1, t_s * 10**9, OP_REMOVED, str(removed), None, "GPU", 0, 1)
        )
    return rows


def _fail_the_end_of_transactions(db) -> None:
    db.execute(
        "CREATE TRIGGER full_disk BEFORE UPDATE OF events_written ON runs "
        "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )


def _aggregates(conn: sqlite3.Connection, run_id: int) -> dict[str, list[tuple]]:
    return {
        t: sorted(conn.execute(f"SELECT * FROM {t} WHERE run_id = ?", (run_id,)).fetchall())
        for t in AGGREGATES
    }


def _writer(path: Path) -> tuple[WatchWriter, int]:
    db, run_id = new_watch_run(path)
    return WatchWriter(db, run_id), run_id


def test_a_rolled_back_batch_is_not_in_the_aggregates_later_writes_store(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    writer, run_id = _writer(path)
    writer.write(WatchBatch(sources=SOURCES, blocks=_blocks(0, 1, [1, 2, 3], [])))
    _fail_the_end_of_transactions(writer.db)
    lost = WatchBatch(blocks=_blocks(2, 2, [4, 5], [1]) + _blocks(0, 2, [1, 2], [], source=1))
    with pytest.raises(sqlite3.IntegrityError, match="disk is full"):
        writer.write(lost)
    writer.db.execute("DROP TRIGGER full_disk")
    writer.write(WatchBatch(blocks=_blocks(4, 3, [6], [2])))
    writer.finish(COMPLETE, dropped_rows=len(lost.blocks))
    assert writer.rows_written == 3  # 1 + 2 rows: the failed batch counts nowhere
    writer.db.conn.close()

    conn = sqlite3.connect(path)
    try:
        stored = conn.execute(
            "SELECT seq, source FROM watch_blocks WHERE run_id = ? ORDER BY rowid", (run_id,)
        ).fetchall()
        assert stored == [(0, 0), (4, 0), (5, 0)]  # the failed batch's rows rolled back
        (written, dropped) = conn.execute(
            "SELECT events_written, dropped_events FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        assert (written, dropped) == (3, 3)
        on_disk = _aggregates(conn, run_id)
        # Source 0 stored 1, 2, 3 and 6 and removed 2: 3 live; source 1 nothing
        live = conn.execute(
            "SELECT source, SUM(blocks) FROM watch_live WHERE run_id = ? GROUP BY source",
            (run_id,),
        ).fetchall()
        assert dict(live).get(0) == 3 and dict(live).get(1, 0) == 0
        with conn:
            fold_run(conn, run_id)  # the aggregates from the rows the file holds
        assert _aggregates(conn, run_id) == on_disk
    finally:
        conn.close()


def test_after_a_trim_a_rolled_back_batch_stops_the_writes_it_would_spoil(
    tmp_path: Path,
) -> None:
    """--keep-raw: the rows to rebuild from are gone, so later batches are refused
    (the recorder counts them dropped) and the file keeps its last consistent state."""
    path = tmp_path / "w.db"
    writer, run_id = _writer(path)
    writer.write(WatchBatch(sources=SOURCES, blocks=_blocks(0, 1, [1, 2], [])))
    assert writer.trim_raw(2 * 10**9) == 1
    before = _aggregates(writer.db.conn, run_id)
    _fail_the_end_of_transactions(writer.db)
    with pytest.raises(sqlite3.IntegrityError):
        writer.write(WatchBatch(blocks=_blocks(1, 2, [3], [])))
    writer.db.execute("DROP TRIGGER full_disk")
    with pytest.raises(KvscopeError, match="cannot be rebuilt"):
        writer.write(WatchBatch(blocks=_blocks(2, 3, [4], [])))
    writer.finish(COMPLETE, dropped_rows=2)
    conn = writer.db.conn
    assert conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone() == (COMPLETE,)
    assert _aggregates(conn, run_id) == before
    conn.close()
