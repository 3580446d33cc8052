"""Writes one run's rows in batches: one transaction per batch, ``executemany`` per table.

The writer knows tables, not engine events: the recorder turns events into the
row tuples a ``Batch`` holds. Each ``write`` also refreshes the run's heartbeat,
event count and dropped-event count, so a reader can tell a live run from one
whose process died (``db.queries.resolve_status``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from sqlite_utils import Database

from kvscope.db.formulas import RunSummary
from kvscope.db.schema import (
    FINAL_STATUSES,
    GPU_COLUMNS,
    KERNEL_COLUMNS,
    PAGE_MAP_COLUMNS,
    RUNNING,
    STEP_COLUMNS,
)

WAL_CHECKPOINT_PAGES = 10_000


class EventShape(NamedTuple):
    """How one kind of generic event becomes a row of the events table.

    Rows for a shape are ``(ts_ns, step, *values)`` with one value per field;
    SQLite builds the JSON payload (``json_object``), which is several times
    faster than encoding it in Python. Fields in ``json_fields`` are bound as
    JSON text (lists); a field named ``request_id`` also fills that column.
    """

    kind: str
    fields: tuple[str, ...]
    json_fields: frozenset[str] = frozenset()


@dataclass(slots=True)
class Batch:
    """Rows for one transaction. Typed tables take tuples in ``db.schema``'s
    column orders (without run_id); the request lists update the requests table."""

    steps: list[tuple] = field(default_factory=list)
    kernels: list[tuple] = field(default_factory=list)
    gpu_samples: list[tuple] = field(default_factory=list)
    page_maps: list[tuple] = field(default_factory=list)
    events: dict[EventShape, list[tuple]] = field(default_factory=dict)
    # (request_id, ts_ns, prompt_tokens, max_tokens)
    arrivals: list[tuple] = field(default_factory=list)
    # (request_id, reason)
    rejections: list[tuple] = field(default_factory=list)
    # (request_id, ts_ns, cached_tokens): first admission only
    schedules: list[tuple] = field(default_factory=list)
    # (request_id, ts_ns, ttft_s)
    first_tokens: list[tuple] = field(default_factory=list)
    # (request_id,)
    preemptions: list[tuple] = field(default_factory=list)
    # (request_id, ts_ns, prompt_tokens, output_tokens, cached_tokens, finish_reason, ttft_s, tpot_s)
    finishes: list[tuple] = field(default_factory=list)

    def __len__(self) -> int:
        # Request updates mirror events already counted in ``events``.
        return (
            len(self.steps)
            + len(self.kernels)
            + len(self.gpu_samples)
            + len(self.page_maps)
            + sum(map(len, self.events.values()))
        )


def _insert(table: str, columns: tuple[str, ...], run_id: int, verb: str = "INSERT") -> str:
    names = ", ".join(("run_id", *columns))
    return f"{verb} INTO {table} ({names}) VALUES ({run_id}, {', '.join('?' * len(columns))})"


def _upsert(columns: tuple[str, ...], updates: str, run_id: int) -> str:
    return (
        f"{_insert('requests', ('request_id', *columns), run_id)} "
        f"ON CONFLICT (run_id, request_id) DO UPDATE SET {updates}"
    )


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _event_insert(shape: EventShape, run_id: int) -> str:
    def value(i: int, name: str) -> str:
        return f"json(?{i})" if name in shape.json_fields else f"?{i}"

    pairs = ", ".join(
        f"{_sql_text(name)}, {value(i, name)}" for i, name in enumerate(shape.fields, 3)
    )
    request = f"?{shape.fields.index('request_id') + 3}" if "request_id" in shape.fields else "NULL"
    return (
        "INSERT INTO events (run_id, ts_ns, step, kind, request_id, payload) "
        f"VALUES ({run_id}, ?1, ?2, {_sql_text(shape.kind)}, {request}, json_object({pairs}))"
    )


def _overwrite(columns: tuple[str, ...]) -> str:
    return ", ".join(f"{c} = excluded.{c}" for c in columns)


_ARRIVAL_COLUMNS = ("arrival_ns", "prompt_tokens", "max_tokens")
_FIRST_TOKEN_COLUMNS = ("first_token_ns", "ttft_s")
_FINISH_COLUMNS = (
    "finished_ns",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "finish_reason",
    "ttft_s",
    "tpot_s",
)


def create_run(
    db: Database,
    *,
    kind: str,
    model: str | None,
    config: Mapping[str, Any],
    hardware: Mapping[str, Any],
    versions: Mapping[str, Any],
    started_at: float,
    start_ns: int,
) -> int:
    """Insert a run row with status 'running', owned by this process; returns its id."""
    with db.atomic():
        cursor = db.execute(
            """INSERT INTO runs (kind, model, config, hardware, versions, status, started_at,
                                 start_ns, heartbeat, writer_pid, writer_host)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (
                kind,
                model,
                json.dumps(dict(config), default=str),
                json.dumps(dict(hardware), default=str),
                json.dumps(dict(versions), default=str),
                RUNNING,
                started_at,
                start_ns,
                time.time(),
                os.getpid(),
                socket.gethostname(),
            ),
        )
    return cursor.lastrowid


class Writer:
    """Appends one run's batches to an open database (one thread at a time)."""

    def __init__(self, db: Database, run_id: int) -> None:
        self.db = db
        self.run_id = run_id
        self.events_written = 0
        # Checkpoint the WAL every ~40 MB instead of every 4 MB: each checkpoint
        # syncs the file, and at the default the syncs halve the insert rate.
        db.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
        r = int(run_id)
        # Typed tables first, then request updates in lifecycle order.
        self._statements = (
            ("steps", _insert("steps", STEP_COLUMNS, r, verb="INSERT OR REPLACE")),
            ("kernels", _insert("kernels", KERNEL_COLUMNS, r)),
            ("gpu_samples", _insert("gpu_samples", GPU_COLUMNS, r)),
            ("page_maps", _insert("page_maps", PAGE_MAP_COLUMNS, r)),
            ("arrivals", _upsert(_ARRIVAL_COLUMNS, _overwrite(_ARRIVAL_COLUMNS), r)),
            ("rejections", _upsert(("rejected_reason",), _overwrite(("rejected_reason",)), r)),
            (
                "schedules",
                _upsert(
                    ("scheduled_ns", "cached_tokens"),
                    "scheduled_ns = COALESCE(scheduled_ns, excluded.scheduled_ns), "
                    "cached_tokens = COALESCE(cached_tokens, excluded.cached_tokens)",
                    r,
                ),
            ),
            ("first_tokens", _upsert(_FIRST_TOKEN_COLUMNS, _overwrite(_FIRST_TOKEN_COLUMNS), r)),
            (
                "preemptions",
                f"INSERT INTO requests (run_id, request_id, preemptions) VALUES ({r}, ?, 1) "
                "ON CONFLICT (run_id, request_id) DO UPDATE SET preemptions = preemptions + 1",
            ),
            ("finishes", _upsert(_FINISH_COLUMNS, _overwrite(_FINISH_COLUMNS), r)),
        )
        self._event_statements: dict[EventShape, str] = {}
        assert {name for name, _ in self._statements} | {"events"} == {
            f.name for f in fields(Batch)
        }

    def write(self, batch: Batch, dropped_events: int = 0) -> None:
        """Insert a batch and refresh the run's heartbeat and counters, atomically."""
        conn = self.db.conn
        with self.db.atomic():
            for shape, rows in batch.events.items():
                sql = self._event_statements.get(shape)
                if sql is None:
                    sql = self._event_statements[shape] = _event_insert(shape, self.run_id)
                conn.executemany(sql, rows)
            for name, sql in self._statements:
                rows = getattr(batch, name)
                if rows:
                    conn.executemany(sql, rows)
            self.events_written += len(batch)
            conn.execute(
                "UPDATE runs SET heartbeat = ?, events_written = ?, dropped_events = ? WHERE id = ?",
                (time.time(), self.events_written, dropped_events, self.run_id),
            )

    def finish(self, status: str, summary: RunSummary | None, dropped_events: int) -> None:
        """Mark the run ended with ``status``; store the summary's figures in ``metrics``."""
        if status not in FINAL_STATUSES:
            raise ValueError(f"final status must be one of {FINAL_STATUSES}, not {status!r}")
        figures = {}
        if summary is not None:
            figures = {
                f.name: float(value)
                for f in fields(summary)
                if isinstance(value := getattr(summary, f.name), (int, float))
                and not isinstance(value, bool)
                and f.name != "run_id"
            }
        with self.db.atomic():
            self.db.execute(
                """UPDATE runs SET status = ?, ended_at = ?, heartbeat = ?, dropped_events = ?
                   WHERE id = ?""",
                (status, time.time(), time.time(), dropped_events, self.run_id),
            )
            self.db.conn.executemany(
                "INSERT OR REPLACE INTO metrics (run_id, name, value) VALUES (?, ?, ?)",
                [(self.run_id, name, value) for name, value in figures.items()],
            )
