"""A run's aggregates folded again from the raw rows its file holds: a watch resumed
on the same run, the writer's state after a failed transaction, and the runs a
migration marked stale (``db.watch_aggregates.watch_agg_stale``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from kvscope.db.source import run_origin
from kvscope.db.watch_aggregates import (
    block_rows,
    clear_aggregates,
    stale_runs,
    write_aggregates,
)
from kvscope.profiler.watch.fold.fold import WatchFold

# (run id, block rows folded so far) after each chunk
FoldProgress = Callable[[int, int], None]


def fold_run(conn: sqlite3.Connection, run_id: int, progress: FoldProgress | None = None,
             chunk: int = 50_000) -> WatchFold:  # fmt: skip
    """The run's state folded from its raw rows, and its aggregates written anew
    (inside the caller's transaction)."""
    fold = WatchFold(run_id, run_origin(conn, run_id))
    for index, engine in conn.execute(
        "SELECT source, engine FROM watch_sources WHERE run_id = ? AND kind = 'events'", (run_id,)
    ):
        fold.add_source(index, engine)
    done = 0
    for rows in block_rows(conn, run_id, chunk):
        fold.apply([row[1:] for row in rows])
        fold.applied_rowid = rows[-1][0]
        done += len(rows)
        if progress is not None:
            progress(run_id, done)
    clear_aggregates(conn, run_id)
    write_aggregates(conn, run_id, fold.changes(final=True))
    return fold


def refold_stale(conn: sqlite3.Connection, progress: FoldProgress | None = None) -> list[int]:
    """Fold again every run a migration marked stale, each in its own transaction;
    returns those runs."""
    runs = stale_runs(conn)
    for run_id in runs:
        with conn:
            fold_run(conn, run_id, progress)
    return runs
