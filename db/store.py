"""Opening a kvscope database: the one place that turns a path into a handle.

``open_db`` creates or migrates the file, switches it to WAL (readers never
block the writer) and turns every way a path can be wrong into one
``KvscopeError`` line, so no caller ever shows a user a sqlite3 traceback.
Only writers (``create=True``: ``run``, ``watch``, ``simulate --db``) start a
kvscope database in a file; readers refuse one that holds none yet, an empty
file included, rather than write a schema into it.
"""

from __future__ import annotations

import os
import sqlite3
from functools import cache
from pathlib import Path

import numpy as np
from sqlite_utils import Database

from kvscope.db.migrations import SCHEMA_VERSION, migrate, schema_version
from kvscope.db.schema import APPLICATION_ID
from kvscope.engine.errors import KvscopeError

# Readers and the writer wait this long for a lock before failing; in WAL mode
# only checkpoints and migrations take one.
BUSY_TIMEOUT_S = 5.0

# Engine code hands numpy scalars around; let sqlite3 bind them as Python numbers.
for _type in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
    sqlite3.register_adapter(_type, int)
for _type in (np.float16, np.float32, np.float64):
    sqlite3.register_adapter(_type, float)
sqlite3.register_adapter(np.bool_, bool)


def default_db_path() -> Path:
    """Where commands read and write when no ``--db`` is given: $KVSCOPE_DB or ./kvscope.db."""
    return Path(os.environ.get("KVSCOPE_DB", "kvscope.db"))


def empty_file(path: str | os.PathLike[str]) -> KvscopeError:
    """The one wording for a zero-byte file given as a database (every reader says it)."""
    return KvscopeError(f"{path} is empty: not a kvscope database (nothing recorded into it)")


def open_db(path: str | os.PathLike[str], *, create: bool = True) -> Database:
    """Open a kvscope database, creating it (``create=True``) and migrating it.

    The handle's connection may be moved to another thread (the recorder's
    writer) but must be used by one thread at a time. Raises ``KvscopeError``
    for a missing file (``create=False``), a directory, a path that cannot be
    opened or written, a file that is not SQLite, an SQLite file of another
    application, an empty file or SQLite database (``create=False``), or a schema
    newer than this code.
    """
    path = Path(path)
    if path.is_dir():
        raise KvscopeError(f"database path {path} is a directory, not a file")
    if not create and not path.exists():
        raise KvscopeError(f"no database at {path}")
    if not create and path.stat().st_size == 0:
        # `runs`, `report` and `dash` had written a whole schema (180 kB) into any empty
        # file named to them (a typo, a file made by `touch`) and then called it empty.
        raise empty_file(path)
    if not create and not _writable(path):
        return _open_read_only(path)
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
    except sqlite3.Error as exc:
        raise KvscopeError(
            f"cannot open database {path}: {exc} (does its directory exist and is it writable?)"
        ) from None
    try:
        db = Database(conn, execute_plugins=False)
        _check_application(db, path, create=create)
        db.execute("PRAGMA journal_mode = wal")
        db.execute("PRAGMA synchronous = normal")  # WAL + normal: a crash loses no commit
        migrate(db)
        _check_tables(db)
    except sqlite3.Error as exc:
        conn.close()
        raise KvscopeError(f"cannot use {path} as a kvscope database: {exc}") from None
    except KvscopeError as exc:
        conn.close()
        raise KvscopeError(f"{path}: {exc}") from None
    return db


def _writable(path: Path) -> bool:
    """Can SQLite write the file and, for WAL's -wal/-shm files, its directory?"""
    return os.access(path, os.W_OK) and os.access(path.parent.resolve(), os.W_OK)


def _open_read_only(path: Path) -> Database:
    """A database on a read-only file or filesystem, for readers (runs, report, tui, dash).

    ``mode=ro`` reads a file whose directory still takes WAL's -shm file; where nothing
    can be written at all, ``immutable=1`` reads the main file as it stands (a writer
    cannot be changing it: nobody can write there). No WAL switch and no migration.
    """
    uri = path.resolve().as_uri()
    for query in ("?mode=ro", "?immutable=1"):
        conn = sqlite3.connect(
            uri + query, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False
        )
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            conn.close()
            error = exc
            continue
        db = Database(conn, execute_plugins=False)
        try:
            _check_application(db, path, create=False)
            version = schema_version(db)
            if version == SCHEMA_VERSION:
                _check_tables(db)
        except KvscopeError as exc:
            conn.close()
            raise KvscopeError(f"{path}: {exc}") from None
        if version != SCHEMA_VERSION:
            conn.close()
            raise KvscopeError(
                f"{path} is read-only and has schema version {version}; this kvscope reads "
                f"{SCHEMA_VERSION} (copy it somewhere writable to migrate it)"
            )
        return db
    raise KvscopeError(f"cannot read database {path}: {error}")


@cache
def _schema_tables() -> frozenset[str]:
    """The tables a database of this schema version has: made once, in memory."""
    db = Database(sqlite3.connect(":memory:"), execute_plugins=False)
    migrate(db)
    tables = frozenset(db.table_names())
    db.conn.close()
    return tables


def _check_tables(db: Database) -> None:
    """A file at this schema version lacking one of its tables was damaged (by hand,
    or by another tool): one error that says so, not a reader's "no such table"
    traceback later."""
    missing = sorted(_schema_tables() - set(db.table_names()))
    if missing:
        raise KvscopeError(
            f"a damaged kvscope database: table{'s' * (len(missing) > 1)} "
            f"{', '.join(missing)} missing"
        )


def _check_application(db: Database, path: Path, *, create: bool) -> None:
    """Ours, or blank and about to become ours (``create``); a reader does not migrate a
    blank SQLite file into a kvscope database, as it must not write one into an empty file."""
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    if app_id == APPLICATION_ID:
        return
    if app_id != 0 or db.table_names():
        raise KvscopeError("an SQLite database of another application, not a kvscope database")
    if not create:
        raise KvscopeError("an empty SQLite database, not a kvscope database (nothing recorded)")
