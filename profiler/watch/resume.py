"""Whether a watch started again continues a run of the same file, and what it takes
over from it: the run's clock, its stored sources (their sequence numbers and
counters) and the rows it has written.

A watch of the same sources into the same file continues the newest run that
watched them, unless another watch may still be writing it (``db.runs``'
liveness rule) or its raw rows were trimmed (``--keep-raw``: its cache state
cannot be rebuilt), so its gaps are replayed or counted lost and its totals
carry on.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscope.db.runs import writer_liveness
from kvscope.db.schema import RUNNING
from kvscope.db.watch_schema import EVENTS_SOURCE, WATCH_KIND


@dataclass(slots=True)
class Resumed:
    """A run to write: a new one (``written`` None) or one continued."""

    run_id: int
    started_at: float
    start_ns: int
    # (endpoint, topic, dp_rank) -> the stored source's row, for events sources
    stored: dict[tuple, dict[str, Any]] = field(default_factory=dict)
    stored_metrics: dict[str, int] = field(default_factory=dict)  # URL -> source
    first_index: int = 0  # the next new source's index
    written: int | None = None  # rows the run holds; None: a new run


def resumable_run(db: Any, config: Mapping[str, Any]) -> Resumed | None:
    """The newest watch run of the same sources that nothing writes any more and that
    kept its raw rows (so its cache state can be rebuilt): (run id, started_at,
    start_ns)."""
    sources = config.get("sources")
    if not sources:
        return None
    for run_id, status, started_at, start_ns, raw, heartbeat, pid, host in db.execute(
        "SELECT id, status, started_at, start_ns, config, heartbeat, writer_pid, writer_host "
        "FROM runs WHERE kind = ? ORDER BY id DESC",
        (WATCH_KIND,),
    ).fetchall():
        try:
            old = json.loads(raw or "{}")
        except ValueError:
            continue
        if old.get("sources") != list(sources) or old.get("engine") != config.get("engine"):
            continue
        if status == RUNNING and not writer_liveness(heartbeat, pid, host).certainly_gone:
            # Another watch may be writing it: do not write over it. A watch killed with
            # its writer process (kill -9 of the group, the OOM killer, a reboot) leaves
            # its run 'running'; once nothing can write it, it is continued.
            return None
        trimmed = db.execute(
            "SELECT raw_trimmed_before FROM watch_agg_state WHERE run_id = ?", (run_id,)
        ).fetchone()
        if trimmed and trimmed[0] is not None:
            return None  # --keep-raw: its cache state cannot be rebuilt; a new run
        return Resumed(run_id, started_at, start_ns)
    return None


def continue_run(db: Any, run: Resumed) -> Resumed:
    """Mark ``run`` running again under this process and read what it carries on."""
    db.execute(
        "UPDATE runs SET status = ?, ended_at = NULL, heartbeat = ?, writer_pid = ? WHERE id = ?",
        (RUNNING, time.time(), os.getpid(), run.run_id),
    )
    db.conn.commit()
    rows = db.execute("SELECT * FROM watch_sources WHERE run_id = ?", (run.run_id,)).fetchall()
    names = [d[0] for d in db.execute("SELECT * FROM watch_sources LIMIT 0").description]
    for row in rows:
        stored = dict(zip(names, row, strict=True))
        if stored["kind"] == EVENTS_SOURCE:
            key = (stored["endpoint"], stored["topic"] or "", stored["dp_rank"])
            run.stored[key] = stored
        else:
            run.stored_metrics[stored["endpoint"]] = stored["source"]
    run.first_index = 1 + max((r[names.index("source")] for r in rows), default=-1)
    (written,) = db.execute(
        "SELECT events_written FROM runs WHERE id = ?", (run.run_id,)
    ).fetchone()
    run.written = written or 0
    return run
