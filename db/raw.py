"""A run's tables at full resolution, for exports (CSV, JSON, Perfetto traces).

The column lists come from db.schema (themselves the engine events' fields), so
an export has every recorded column and nothing else.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from sqlite_utils import Database

from kvscope.db.schema import GPU_COLUMNS, KERNEL_COLUMNS, STEP_COLUMNS
from kvscope.db.source import Source, connection, run_origin

RAW_TABLES = {
    "steps": STEP_COLUMNS,
    "kernels": KERNEL_COLUMNS,
    "gpu_samples": GPU_COLUMNS,
    "events": ("ts_ns", "step", "kind", "request_id", "payload"),
}


def raw_rows(
    source: Database | sqlite3.Connection, run_id: int, table: str
) -> tuple[list[str], Iterator[tuple]]:
    """(column names, rows) of one table, oldest first, with ``t_s`` (seconds since
    the run's start) in place of ``ts_ns``. Rows stream from SQLite, so this
    takes an open connection, which must stay open while they are read."""
    columns = ", ".join(c for c in RAW_TABLES[table] if c != "ts_ns")
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
    cursor = conn.execute(
        f"SELECT (ts_ns - ?) / 1e9 AS t_s, {columns} FROM {table} "
        "WHERE run_id = ? ORDER BY ts_ns, rowid",
        (start_ns, run_id),
    )
    return [d[0] for d in cursor.description], iter(cursor)


def last_step_ns(source: Source, run_id: int) -> int | None:
    """The latest step summary, in nanoseconds since the run's start."""
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        (last,) = conn.execute(
            "SELECT MAX(ts_ns) FROM steps WHERE run_id = ?", (run_id,)
        ).fetchone()
    return None if last is None else last - start_ns
