"""Writes a watched deployment's rows in batches, one transaction per flush.

Every write inserts the batch's rows (``db.watch_batch``), folds its block rows
(``profiler.watch.fold``), writes what changed in the aggregates the views read
(``db.watch_aggregates``) and refreshes the run's heartbeat, in one
transaction: a view never has to replay the raw events, and readers tell a live
watch from a dead one as they do for a run.

The fold lives in memory and changes as the rows are folded in, before the
transaction commits: a transaction that fails after that point (a full disk at
the write or the commit) is rolled back on disk but not in memory, so the fold
is then rebuilt from the rows the file holds before anything else is written;
never would a later write store aggregates of rows the file does not have.
"""

from __future__ import annotations

import time

from sqlite_utils import Database

from kvscope.db.checkpointer import Checkpointer
from kvscope.db.schema import FINAL_STATUSES
from kvscope.db.source import run_origin
from kvscope.db.watch_aggregates import write_aggregates
from kvscope.db.watch_batch import SOURCE_COLUMNS, WatchBatch, insert_statement, unpack_hashes
from kvscope.db.watch_schema import (
    BLOCK_COLUMNS,
    INCIDENT_COLUMNS,
    METRIC_COLUMNS,
    RAW_COLUMNS,
    SOURCE_COUNTERS,
)
from kvscope.db.writer import WAL_CHECKPOINT_PAGES
from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.fold import WatchFold, fold_run


class WatchWriter:
    """Appends one watch run's batches to an open database (one thread at a time)."""

    def __init__(self, db: Database, run_id: int) -> None:
        self.db = db
        self.run_id = run_id
        self.rows_written = 0
        self.committed_at: float | None = None  # time.perf_counter() of the last write's commit
        db.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
        r = int(run_id)
        # Whether the run has raw rows, from its aggregates' state (watch_blocks has no
        # run_id index: a new run's look there would read the whole file).
        folded = db.execute(
            "SELECT applied_rowid, raw_trimmed_before FROM watch_agg_state WHERE run_id = ?", (r,)
        ).fetchone()
        has_rows = folded is not None and folded[0] > 0
        if has_rows and folded[1] is not None:
            raise KvscopeError(
                f"run {r} kept only recent raw events (--keep-raw): its cache state "
                "cannot be rebuilt to continue it; start a new watch"
            )
        # A run written before (a resumed watch) continues from its folded state.
        self.state = self._folded_state(has_rows)
        self._stale = False  # the state holds rows a failed transaction did not store
        # The WAL is copied into the file beside the writing, not in its commits
        # (db.checkpointer); the automatic checkpoint above is the bound if it lags.
        # Started once nothing here can fail any more (a refused resume, above).
        (_, _, path) = db.execute("PRAGMA database_list").fetchone()
        self._checkpointer = Checkpointer(path) if path else None
        self._statements = (
            ("sources", insert_statement("watch_sources", SOURCE_COLUMNS, r)),
            ("blocks", insert_statement("watch_blocks", BLOCK_COLUMNS, r)),
            ("raw", insert_statement("watch_raw", RAW_COLUMNS, r)),
            ("incidents", insert_statement("watch_incidents", INCIDENT_COLUMNS, r)),
            ("metrics", insert_statement("watch_metrics", METRIC_COLUMNS, r)),
            (
                "counters",
                "UPDATE watch_sources SET "
                + ", ".join(f"{c} = ?" for c in SOURCE_COUNTERS)
                + f" WHERE run_id = {r} AND source = ?",
            ),
        )

    def _folded_state(self, has_rows: bool) -> WatchFold:
        """The run's state: folded from its rows (``has_rows``), or a new one."""
        db, r = self.db, self.run_id
        if has_rows:
            with db.atomic():
                state = fold_run(db.conn, r)
        else:
            state = WatchFold(r, run_origin(db.conn, r))
        for source, engine in db.execute(
            "SELECT source, engine FROM watch_sources WHERE run_id = ? AND kind = 'events'", (r,)
        ).fetchall():
            state.add_source(source, engine)
        return state

    def _refold(self) -> bool:
        """After a failed transaction, the state as of what the file holds; False if it
        cannot be had (raw rows trimmed: --keep-raw), the state left as it was."""
        (trimmed,) = self.db.execute(
            "SELECT raw_trimmed_before FROM watch_agg_state WHERE run_id = ?", (self.run_id,)
        ).fetchone() or (None,)
        if trimmed is not None:
            return False
        self.state = self._folded_state(has_rows=True)
        self._stale = False
        return True

    def write(self, batch: WatchBatch, dropped_rows: int = 0) -> None:
        """Insert a batch and refresh the run's heartbeat and counters, atomically."""
        if self._stale and not self._refold():
            raise KvscopeError(
                f"run {self.run_id}: a failed write left its aggregates behind and its raw "
                "rows were trimmed (--keep-raw), so they cannot be rebuilt: not written"
            )
        conn = self.db.conn
        state = self.state
        if batch.hash_lists:
            batch.hash_lists = unpack_hashes(batch.hash_lists)
        for row in batch.sources:
            if row[1] == "events":
                state.add_source(row[0], row[2])
        rows_written = self.rows_written + len(batch.blocks) + len(batch.raw)
        folding = False
        try:
            with self.db.atomic():
                for name, sql in self._statements:
                    rows = getattr(batch, name)
                    if rows:
                        conn.executemany(sql, rows)
                # From here the state changes with the transaction (apply folds rows
                # in, changes hands its deltas over), not as the transaction does.
                folding = True
                if batch.blocks:
                    state.apply(batch.blocks, batch.hash_lists)
                    state.applied_rowid = conn.execute(
                        "SELECT MAX(rowid) FROM watch_blocks"
                    ).fetchone()[0]
                write_aggregates(conn, self.run_id, state.changes())
                if batch.model is not None:
                    conn.execute(
                        "UPDATE runs SET model = ? WHERE id = ? AND model IS NULL",
                        (batch.model, self.run_id),
                    )
                conn.execute(
                    "UPDATE runs SET heartbeat = ?, events_written = ?, dropped_events = ? "
                    "WHERE id = ?",
                    (time.time(), rows_written, dropped_rows, self.run_id),
                )
        except BaseException:
            self._stale = self._stale or folding  # rebuilt before the next write
            raise
        self.rows_written = rows_written
        self.committed_at = time.perf_counter()
        if self._checkpointer is not None:
            self._checkpointer.committed(len(batch.blocks) + len(batch.raw))

    def trim_raw(self, before_ns: int) -> int:
        """Delete this run's raw block and unknown-event rows older than ``before_ns``
        (``--keep-raw``); the aggregates the views read stay. Returns rows deleted."""
        if self._stale:
            self._refold()  # while the rows to rebuild the state from are all there
        r = self.run_id
        with self.db.atomic():
            conn = self.db.conn
            deleted = 0
            for table in ("watch_blocks", "watch_raw"):
                # Rows are in arrival order: the first one young enough bounds the rest.
                row = conn.execute(
                    f"SELECT rowid FROM {table} WHERE run_id = ? AND ts_ns >= ? "
                    "ORDER BY rowid LIMIT 1",
                    (r, before_ns),
                ).fetchone()
                bound = "" if row is None else f" AND rowid < {int(row[0])}"
                deleted += conn.execute(
                    f"DELETE FROM {table} WHERE run_id = ? AND ts_ns < ?{bound}", (r, before_ns)
                ).rowcount
            conn.execute(
                "UPDATE watch_agg_state SET raw_trimmed_before = ? WHERE run_id = ?",
                (before_ns, r),
            )
        if self._checkpointer is not None:
            self._checkpointer.committed(deleted)
        return deleted

    def finish(self, status: str, dropped_rows: int) -> None:
        """Mark the run ended with ``status``."""
        if status not in FINAL_STATUSES:
            raise ValueError(f"final status must be one of {FINAL_STATUSES}, not {status!r}")
        # A state that cannot be rebuilt is not written: the file's aggregates are
        # those of the last write that succeeded, as its rows are.
        if self._checkpointer is not None:
            self._checkpointer.close()  # the last connection's close copies the rest
            self._checkpointer = None
        persist = not self._stale or self._refold()
        now = time.time()
        with self.db.atomic():
            if persist:
                write_aggregates(self.db.conn, self.run_id, self.state.changes(final=True))
            self.db.execute(
                """UPDATE runs SET status = ?, ended_at = ?, heartbeat = ?, dropped_events = ?
                   WHERE id = ?""",
                (status, now, now, dropped_rows, self.run_id),
            )
