"""How the read functions reach a database, and the clock every figure is on.

Every read function takes a ``Source``: a ``sqlite_utils.Database`` from
``db.store.open_db``, a ``sqlite3.Connection``, or a path (opened read-side
and closed again). Times leave ``db`` as seconds since the run's start
(``t_s``); ``run_origin`` is that start. ``bucket_sql`` is the one definition
of time buckets every series and event count uses.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlite_utils import Database

from kvscope.db.store import open_db
from kvscope.engine.errors import KvscopeError

Source = Database | sqlite3.Connection | str | os.PathLike


def stored_json(text: str | None, run_id: int, column: str) -> dict:
    """A run's JSON column (config, hardware, versions) as a dict, ``{}`` when empty; a
    damaged one is one error naming the run and the column, not a JSONDecodeError."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise KvscopeError(f"run {run_id}'s {column} is not a JSON object: the database is damaged")
    return value


# Open ends of a time window, in nanoseconds.
NO_START = -(2**62)
NO_END = 2**62


@contextmanager
def connection(source: Source) -> Iterator[sqlite3.Connection]:
    """The source as a connection; one opened here is closed on leaving."""
    if isinstance(source, Database):
        yield source.conn
    elif isinstance(source, sqlite3.Connection):
        yield source
    else:
        db = open_db(source, create=False)
        try:
            yield db.conn
        finally:
            db.conn.close()


@contextmanager
def reader(path: str | os.PathLike[str]) -> Iterator[Database]:
    """One read connection for one callback or report, closed afterwards.

    Raises KvscopeError when there is no database at ``path``: readers never
    create one.
    """
    db = open_db(path, create=False)
    try:
        yield db
    finally:
        db.conn.close()


def run_origin(conn: sqlite3.Connection, run_id: int) -> int:
    """The run's monotonic start (ns), the origin of every t_s; KvscopeError if
    the database has no such run."""
    row = conn.execute("SELECT start_ns FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise KvscopeError(f"no run {run_id} in this database")
    return row[0]


def window(start_ns: int, since_s: float | None, until_s: float | None) -> tuple[int, int]:
    """[since_s, until_s] (seconds since the run's start, None = open) in nanoseconds."""
    lo = start_ns + int(since_s * 1e9) if since_s is not None else NO_START
    hi = start_ns + int(until_s * 1e9) if until_s is not None else NO_END
    return lo, hi


def bucket_sql(lo_ns: int, hi_ns: int, buckets: int, column: str = "ts_ns") -> str:
    """SQL for the bucket of ``column`` when [lo_ns, hi_ns] is cut into ``buckets``
    equal parts: 0 for ``lo_ns`` up to ``buckets - 1`` for ``hi_ns``."""
    return f"CAST(({column} - {int(lo_ns)}) * {int(buckets)} / ({int(hi_ns)} - {int(lo_ns)} + 1) AS INTEGER)"


def bucket_width_s(lo_ns: int, hi_ns: int, buckets: int) -> float:
    """Seconds each of ``bucket_sql``'s buckets covers."""
    return (hi_ns - lo_ns + 1) / buckets / 1e9


def kinds_sql(kinds: tuple[str, ...] | list[str]) -> str:
    """``kinds`` as an SQL list of literals (event kinds are identifiers from
    engine.events, never user text)."""
    assert all(kind.isidentifier() for kind in kinds), kinds
    return ", ".join(f"'{kind}'" for kind in kinds)


@dataclass(frozen=True, slots=True)
class Position:
    """A point in a run to read "as of": a step and its step summary's timestamp.

    An event counts as by the position when its step is at most ``step`` and
    its timestamp at most ``ts_ns``: an engine stamps every event with the step
    it belongs to, while timestamps of consecutive steps can touch (the
    synthetic clock shares one per step).
    """

    run_id: int
    step: int
    ts_ns: int
