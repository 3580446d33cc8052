"""Copying a busy writer's WAL into the database file on a thread of its own.

In WAL mode every commit appends pages to the ``-wal`` file, and a checkpoint
copies them into the database file (and syncs both). SQLite's automatic
checkpoint runs inside the commit that crosses ``wal_autocheckpoint`` pages, on
the writer's own thread, and the last connection to close checkpoints whatever
is left. For ``kvscope watch`` both sat on the critical path: the writer
(process) is what bounds ingestion (issue 23), and a 40 MB checkpoint in its
commit cost it 50-80 ms; after a burst, the close copied and synced the last
30 MB of WAL (77 ms of the 90 ms stop, measured by hand on this machine).

A ``Checkpointer`` runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own
connection, woken after each commit: it copies while the writer folds the next
chunk (SQLite releases the GIL for the copy), never blocks the writer or a
reader (PASSIVE takes no lock they wait for), and leaves the close only the
last commit's pages. The writer's own automatic checkpoint stays as the bound
if this thread falls behind; a checkpoint that finds this thread's lock held
simply skips.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading

log = logging.getLogger(__name__)

# Each checkpoint syncs both files, a fixed cost worth paying at once for a large
# commit, and at most this often for small ones (an idle watch's trickle).
LARGE_ROWS = 2_000
INTERVAL_S = 1.0
NICE = 10


class Checkpointer:
    """Checkpoints ``path``'s WAL after commits (``committed``), until ``close``."""

    def __init__(
        self, path: str | os.PathLike[str], *, large_rows: int = LARGE_ROWS,
        interval_s: float = INTERVAL_S,
    ) -> None:  # fmt: skip
        self.path = os.fspath(path)
        self.large_rows = large_rows
        self.interval_s = interval_s
        self.checkpoints = 0  # that ran to the end (copied all they found, none busy)
        self.error: str | None = None  # why it never started, if it did not
        self._pending = 0  # rows committed since the last checkpoint
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="kvscope-checkpointer", daemon=True)
        self._thread.start()

    def committed(self, rows: int) -> None:
        """A commit of ``rows`` rows happened."""
        with self._wake:
            self._pending += rows
            if self._pending >= self.large_rows:
                self._wake.notify()

    def close(self) -> None:
        """Stop after the checkpoint under way, if any (the close of the last
        connection copies the rest)."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        if sys.platform.startswith("linux"):  # a thread's own nice: Linux only
            try:  # below the writer's priority: it copies in what the writer leaves of the CPU
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
            except OSError:
                pass
        try:
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None)
        except sqlite3.Error as exc:  # the writer's own checkpoints still run
            self.error = str(exc)
            return
        try:
            while True:
                with self._wake:
                    # a large commit wakes it at once; small ones are taken once a while
                    while not self._closing and self._pending < self.large_rows:
                        if not self._wake.wait(self.interval_s) and self._pending:
                            break
                    if self._closing:
                        return
                    self._pending = 0
                try:
                    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # a locked file, a full disk: the next one tries
                    log.debug("checkpoint of %s: %s", self.path, exc)
                    continue
                if not busy:
                    self.checkpoints += 1
        finally:
            conn.close()
