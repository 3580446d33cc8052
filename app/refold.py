"""Watch runs whose aggregates an upgrade left stale, folded again when a command
opens their database to show it (``kvscope runs``, ``tui``, ``dash``, ``report``).

A migration that changes what the aggregates hold only marks the runs it
changes (db/ knows nothing of the fold); folding them takes a second per few
hundred thousand block events, so it is said on stderr, with the rows done.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def refold_stale(path: Path) -> list[int]:
    """Fold the stale runs of the database at ``path`` again; returns them. A missing,
    read-only or unreadable file is left to the command's own checks."""
    if not path.is_file() or not os.access(path, os.W_OK):
        return []
    from kvscope.db.store import open_db
    from kvscope.db.watch_aggregates import stale_runs
    from kvscope.engine.errors import KvscopeError
    from kvscope.profiler.watch.fold import refold_stale as fold_again

    try:
        db = open_db(path, create=False)
    except KvscopeError:
        return []
    try:
        if not stale_runs(db.conn):
            return []

        def progress(run_id: int, rows: int) -> None:
            print(f"\rkvscope: folding watch run {run_id} again (schema upgrade): "
                  f"{rows:,} block rows", end="", file=sys.stderr, flush=True)  # fmt: skip

        runs = fold_again(db.conn, progress)
        print(file=sys.stderr)
        return runs
    finally:
        db.conn.close()
