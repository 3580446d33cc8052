"""Opening databases: bad paths give one clear error, schemas migrate forward."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from kvscope.db import queries
from kvscope.db.migrations import SCHEMA_VERSION, migrate, schema_version
from kvscope.db.schema import (
    APPLICATION_ID,
    GPU_COLUMNS,
    INCOMPLETE,
    KERNEL_COLUMNS,
    PAGE_MAP_COLUMNS,
    STEP_COLUMNS,
)
from kvscope.db.store import open_db
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import GpuSample, KernelTiming, StepSummary


def test_new_database_is_wal_current_and_marked(tmp_path: Path) -> None:
    db = open_db(tmp_path / "k.db")
    assert db.journal_mode == "wal"
    assert schema_version(db) == SCHEMA_VERSION == 10
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # normal
    db.conn.close()
    # Opening again is a no-op migration.
    db = open_db(tmp_path / "k.db")
    assert schema_version(db) == SCHEMA_VERSION
    db.conn.close()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing-dir" / "k.db", "cannot open database"),
        (lambda p: (p / "file.txt").write_text("x") and p / "file.txt" / "k.db", "cannot open"),
        (lambda p: p, "is a directory"),
        (
            lambda p: (p / "notes.db").write_text("not sqlite " * 20) and p / "notes.db",
            "not a database",
        ),
    ],
)
def test_bad_paths_raise_one_line(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(KvscopeError) as info:
        open_db(make(tmp_path))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_other_sqlite_application_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    with pytest.raises(KvscopeError, match="another application"):
        open_db(path)


def test_missing_file_is_not_created_for_readers(tmp_path: Path) -> None:
    with pytest.raises(KvscopeError, match="no database at"):
        open_db(tmp_path / "typo.db", create=False)
    assert not (tmp_path / "typo.db").exists()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    open_db(path).conn.close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(KvscopeError, match="newer than this kvscope"):
        open_db(path)


def test_migration_from_version_1_keeps_runs(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite_utils.Database(sqlite3.connect(path), execute_plugins=False)
    assert migrate(db, target=1) == 1
    assert "metrics" not in db.table_names()
    assert "heartbeat" not in db["runs"].columns_dict
    db["runs"].insert_all(
        [
            {
                "kind": "engine",
                "model": "m",
                "status": "complete",
                "started_at": 1.0,
                "start_ns": 0,
            },
            {"kind": "engine", "model": "m", "status": "running", "started_at": 1.0, "start_ns": 0},
        ]
    )
    db["steps"].insert(
        {"run_id": 1, "step": 0, "ts_ns": 5_000_000_000, "pages_total": 10, "pages_used": 4}
        | {"page_size": 16, "tokens_held": 50, "duration_s": 0.1}
    )
    db.conn.commit()
    db.conn.close()

    db = open_db(path)
    assert schema_version(db) == SCHEMA_VERSION
    assert {"heartbeat", "writer_pid", "writer_host"} <= set(db["runs"].columns_dict)
    assert "metrics" in db.table_names()
    runs = {run.run_id: run for run in queries.list_runs(db)}
    assert runs[1].status == "complete"
    # A v1 writer kept no heartbeat: its 'running' run can only be incomplete now.
    assert runs[2].status == INCOMPLETE
    assert queries.run_summary(db, 1).peak_page_usage == pytest.approx(0.4)
    assert queries.run_summary(db, 1).elapsed_s == pytest.approx(5.0)
    db.conn.close()


def test_insert_column_orders_match_tables_and_events(tmp_path: Path) -> None:
    db = open_db(tmp_path / "k.db")
    for table, columns, event in (
        ("steps", STEP_COLUMNS, StepSummary),
        ("kernels", KERNEL_COLUMNS, KernelTiming),
        ("gpu_samples", GPU_COLUMNS, GpuSample),
    ):
        assert set(columns) <= set(db[table].columns_dict)
        assert set(columns) <= set(event.__dataclass_fields__)
    assert set(PAGE_MAP_COLUMNS) <= set(db["page_maps"].columns_dict)
    db.conn.close()


def test_migration_to_version_4_keeps_gpu_samples_under_gpu_index(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    db = sqlite_utils.Database(sqlite3.connect(path), execute_plugins=False)
    assert migrate(db, target=3) == 3
    db["runs"].insert(
        {"kind": "engine", "model": "m", "status": "complete", "started_at": 1.0, "start_ns": 0}
    )
    db["gpu_samples"].insert_all(
        [
            {"run_id": 1, "ts_ns": 1_000_000_000 * i, "step": i, "device": i % 2}
            | {"utilization_pct": 40.0 + i, "memory_used_bytes": 1 << 30}
            for i in range(4)
        ]
    )
    db.conn.commit()
    db.conn.close()

    db = open_db(path)
    assert schema_version(db) == SCHEMA_VERSION
    columns = db["gpu_samples"].columns_dict
    assert "gpu_index" in columns and "device" not in columns
    points = queries.gpu_series(db, 1)
    assert sorted({p.gpu_index for p in points}) == [0, 1]
    assert sorted(p.utilization_pct for p in points) == [40.0, 41.0, 42.0, 43.0]
    db.conn.close()


def test_a_database_missing_one_of_its_tables_is_one_error(tmp_path: Path) -> None:
    """Tables dropped by hand (or another tool) had been a reader's "no such table"
    traceback in runs, report, replay and tui; opening says so instead, read-write and
    read-only alike."""
    path = tmp_path / "k.db"
    open_db(path).conn.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE requests")
        conn.execute("DROP TABLE steps")
    with pytest.raises(KvscopeError, match="damaged kvscope database: tables requests, steps"):
        open_db(path)
    path.chmod(0o444)
    try:
        with pytest.raises(KvscopeError, match="tables requests, steps missing"):
            open_db(path, create=False)
    finally:
        path.chmod(0o644)


def _blank_sqlite(path: Path) -> Path:
    """An SQLite file with no tables and no application id (what another tool leaves)."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE scratch (x)")
        conn.execute("DROP TABLE scratch")
    assert path.stat().st_size > 0
    return path


def test_readers_refuse_an_empty_file_and_leave_it_empty(tmp_path: Path) -> None:
    """Readers had migrated a 0-byte file into a whole kvscope schema (180 kB) before
    saying it held no runs; an empty file, or an SQLite file holding nothing, is refused
    and left as it was, writable or read-only."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(KvscopeError, match=r"empty\.db is empty: not a kvscope database"):
        open_db(empty, create=False)
    assert empty.stat().st_size == 0
    blank = _blank_sqlite(tmp_path / "blank.db")
    size = blank.stat().st_size
    with pytest.raises(KvscopeError, match="an empty SQLite database, not a kvscope database"):
        open_db(blank, create=False)
    assert blank.stat().st_size == size and not Path(f"{blank}-wal").exists()
    with sqlite3.connect(blank) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    for path in (empty, blank):
        path.chmod(0o444)
        try:
            with pytest.raises(KvscopeError, match="not a kvscope database"):
                open_db(path, create=False)
        finally:
            path.chmod(0o644)


def test_writers_still_start_a_database_in_an_empty_file(tmp_path: Path) -> None:
    for path in (tmp_path / "empty.db", _blank_sqlite(tmp_path / "blank.db")):
        if path.name == "empty.db":
            path.write_bytes(b"")
        db = open_db(path)
        assert schema_version(db) == SCHEMA_VERSION
        db.conn.close()
        open_db(path, create=False).conn.close()  # and readers read it from then on
