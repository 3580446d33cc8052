"""The tables of a watched deployment (run kind ``watch``): sources, block events,
raw events, incidents and /metrics samples.

``create_watch_tables`` is schema version 3's migration body (``db.migrations``);
change it only by adding a migration. ``watch_blocks`` holds one row per event
as published (but consecutive plain BlockRemoved events of a batch, which may
share one: ``profiler.watch.rows``), its hashes a JSON array (one row per hash
would cost several times the insert rate at fleet scale); the view
``watch_block_hashes`` gives one row per block with its parent, for plain SQL.
"""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database

WATCH_KIND = "watch"

# watch_blocks.op
OP_STORED = 1
OP_REMOVED = 2
OP_CLEARED = 3  # AllBlocksCleared: the engine dropped its whole prefix cache
OP_RESET = 4  # the engine restarted: everything it held is gone
CLEARING_OPS = (OP_CLEARED, OP_RESET)

# watch_sources.kind
EVENTS_SOURCE = "events"
METRICS_SOURCE = "metrics"

BLOCK_COLUMNS = (
    "source",
    "seq",
    "ts_ns",
    "op",
    "block_hashes",
    "parent_hash",
    "medium",
    "group_idx",
    "blocks",
)
RAW_COLUMNS = ("source", "seq", "ts_ns", "type", "payload")
INCIDENT_COLUMNS = (
    "source",
    "ts_ns",
    "kind",
    "first_seq",
    "last_seq",
    "recovered",
    "lost",
    "detail",
)
METRIC_COLUMNS = ("source", "ts_ns", "name", "labels", "value")
# The recorder's own samples in watch_metrics, under a source index no engine has:
# its queue of batches not yet written and how far the writing lags behind.
PRESSURE_SOURCE = -1
QUEUE_METRIC = "kvscope:watch_queue_batches"
LAG_METRIC = "kvscope:watch_lag_seconds"
# Counters of a source, refreshed by the writer on every flush.
SOURCE_COUNTERS = (
    "block_size",
    "last_seq",
    "batches",
    "events",
    "block_events",
    "gaps",
    "recovered_batches",
    "lost_batches",
    "restarts",
    "disconnects",
    "bad_messages",
    "attrs",
)


def table_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The columns ``table`` has in this file: a file opened read-only, or folded
    by a migration before a later one adds a column, may lack the newest."""
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def drop_raw_run_index(db: Database) -> None:
    """Schema version 7's migration body: ``watch_blocks`` loses the ``run_id`` index
    version 6 gave it. Every view reads the aggregates, and the index had cost 40%
    of the insert rate of one-hash events (issue 23); the few readers of one run's
    raw rows (a resumed watch's rebuild, ``--keep-raw`` trimming) walk them in rowid
    order, as written."""
    db.execute("DROP INDEX IF EXISTS watch_blocks_run")


def create_watch_tables(db: Database) -> None:
    run_fk = [("run_id", "runs", "id")]
    db["watch_sources"].create(
        {
            "run_id": int,
            "source": int,  # the source's number within its run
            "kind": str,  # 'events' or 'metrics'
            "engine": str,  # 'vllm' or 'sglang': hashes compare only within one kind
            "endpoint": str,
            "replay": str,
            "topic": str,
            "dp_rank": int,
            "listen": int,
            "block_size": int,
            "last_seq": int,
            "batches": int,
            "events": int,
            "block_events": int,
            "gaps": int,
            "recovered_batches": int,
            "lost_batches": int,  # batches missed and not recovered by replay
            "restarts": int,
            "disconnects": int,
            "bad_messages": int,
            "attrs": str,  # JSON: values seen of fields kept per source (spec kinds, LoRAs)
        },
        pk=("run_id", "source"),
        foreign_keys=run_fk,
        defaults={
            name: 0 for name in SOURCE_COUNTERS if name not in ("block_size", "last_seq", "attrs")
        },
    )
    db["watch_blocks"].create(
        {
            "run_id": int,
            "source": int,
            "seq": int,
            "ts_ns": int,  # the engine's timestamp on the run's clock
            "op": int,
            "block_hashes": str,  # JSON array of signed 64-bit hashes, parent first
            "parent_hash": int,  # of the first block (BlockStored)
            "medium": str,
            "group_idx": int,
            "blocks": int,  # length of block_hashes
        },
    )
    # No index: every reader replays the table in arrival order, and an index
    # would halve the rate the writer keeps up with.
    db.execute(
        """CREATE VIEW watch_block_hashes AS
           SELECT b.run_id, b.rowid AS event_id, b.source, b.seq, b.ts_ns, b.op,
                  j.key AS position, j.value AS block_hash,
                  CASE WHEN j.key = 0 THEN b.parent_hash
                       ELSE json_extract(b.block_hashes, '$[' || (j.key - 1) || ']') END
                    AS parent_hash,
                  b.medium, b.group_idx
           FROM watch_blocks b, json_each(b.block_hashes) j"""
    )
    db["watch_raw"].create(
        {
            "run_id": int,
            "source": int,
            "seq": int,
            "ts_ns": int,
            "type": str,
            "payload": str,  # JSON of the fields this kvscope does not know
        },
    )
    db["watch_incidents"].create(
        {
            "run_id": int,
            "source": int,
            "ts_ns": int,
            "kind": str,  # gap, restart, connected, disconnected, bad_message, scrape_error
            "first_seq": int,
            "last_seq": int,
            "recovered": int,
            "lost": int,
            "detail": str,
        },
    )
    db["watch_incidents"].create_index(["run_id", "source"])
    db["watch_metrics"].create(
        {
            "run_id": int,
            "source": int,
            "ts_ns": int,
            "name": str,
            "labels": str,  # 'k="v",...' sorted, without the braces
            "value": float,
        },
    )
    db["watch_metrics"].create_index(["run_id", "name", "ts_ns"])
