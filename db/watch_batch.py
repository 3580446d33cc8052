"""One flush of a watched deployment: its rows for every watch table, and how each
table's rows are inserted.

``profiler.watch`` turns batches, incidents and scrapes into the row tuples of a
``WatchBatch``; ``profiler.watch.writer`` inserts them, folds the block rows and
writes the aggregates in one transaction. Like ``db.writer``, this knows tables,
not events.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

SOURCE_COLUMNS = ("source", "kind", "engine", "endpoint", "replay", "topic", "dp_rank", "listen")


@dataclass(slots=True)
class WatchBatch:
    """Rows for one transaction, in ``db.watch_schema``'s column orders (without run_id)."""

    sources: list[tuple] = field(default_factory=list)  # SOURCE_COLUMNS
    blocks: list[tuple] = field(default_factory=list)
    raw: list[tuple] = field(default_factory=list)
    incidents: list[tuple] = field(default_factory=list)
    metrics: list[tuple] = field(default_factory=list)
    # (*SOURCE_COUNTERS, source): the sources' counters as of this batch
    counters: list[tuple] = field(default_factory=list)
    model: str | None = None  # the served model, once known: the run's model if unset
    # The hashes of each row of ``blocks`` as ints, or packed (``unpack_hashes``; None:
    # parsed from the row's JSON), so the aggregates need not parse what the
    # recorder just formatted.
    hash_lists: list[list[int] | bytes | None] | None = None


def unpack_hashes(hash_lists: list[list[int] | bytes | None]) -> list[list[int] | None]:
    """The hashes of each block row for the aggregates, as lists: the usual batch's
    come packed (bytes of native 64-bit ints, ``profiler.watch.rows``), read signed,
    as SQLite keeps them."""
    return [_unpacked(h) if h.__class__ is bytes else h for h in hash_lists]


def _unpacked(packed: bytes) -> list[int]:
    signed = array("q")
    signed.frombytes(packed)
    return signed.tolist()


def insert_statement(table: str, columns: tuple[str, ...], run_id: int) -> str:
    names = ", ".join(("run_id", *columns))
    return f"INSERT INTO {table} ({names}) VALUES ({run_id}, {', '.join('?' * len(columns))})"
