"""Forward migrations: one function per schema version, applied in order.

A database's ``PRAGMA user_version`` is the number of migrations applied to it.
Each migration runs in its own ``BEGIN IMMEDIATE`` transaction, so two processes
opening a new file at once cannot both apply it, and a crash mid-migration
leaves the previous version intact. Never edit a released migration: add one.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlite_utils import Database

from kvscope.db.schema import APPLICATION_ID
from kvscope.db.watch_aggregates import (
    add_forgotten_removals,
    add_prefill_columns,
    create_aggregate_tables,
    create_stale_table,
    mark_stale,
)
from kvscope.db.watch_schema import create_watch_tables, drop_raw_run_index
from kvscope.engine.errors import KvscopeError


def _v1_initial(db: Database) -> None:
    """Runs, requests, step summaries, generic events, kernels, GPU samples, page maps."""
    db["runs"].create(
        {
            "id": int,
            "kind": str,
            "model": str,
            "config": str,  # JSON
            "hardware": str,  # JSON
            "versions": str,  # JSON
            "status": str,
            "started_at": float,  # time.time() at the start
            "start_ns": int,  # monotonic clock at the start: events' ts_ns origin
            "ended_at": float,
            "events_written": int,
            "dropped_events": int,
        },
        pk="id",
        not_null=["kind", "status", "started_at", "start_ns"],
        defaults={"events_written": 0, "dropped_events": 0},
    )
    run_fk = [("run_id", "runs", "id")]
    db["requests"].create(
        {
            "run_id": int,
            "request_id": int,
            "arrival_ns": int,
            "prompt_tokens": int,
            "max_tokens": int,
            "scheduled_ns": int,
            "first_token_ns": int,
            "finished_ns": int,
            "output_tokens": int,
            "cached_tokens": int,
            "finish_reason": str,
            "ttft_s": float,
            "tpot_s": float,
            "preemptions": int,
            "rejected_reason": str,
        },
        pk=("run_id", "request_id"),
        foreign_keys=run_fk,
        defaults={"preemptions": 0},
    )
    db["steps"].create(
        {"run_id": int, "step": int, "ts_ns": int}
        | {name: int for name in _V1_STEP_COUNTERS}
        | {"duration_s": float},
        pk=("run_id", "step"),
        foreign_keys=run_fk,
    )
    db["steps"].create_index(["run_id", "ts_ns"])
    db["events"].create(
        {
            "id": int,
            "run_id": int,
            "ts_ns": int,
            "step": int,
            "kind": str,
            "request_id": int,
            "payload": str,  # JSON of the event's own fields
        },
        pk="id",
        foreign_keys=run_fk,
    )
    # One index: every reader filters events by kind; each index costs the writer.
    db["events"].create_index(["run_id", "kind", "ts_ns"])
    db["kernels"].create(
        {
            "run_id": int,
            "ts_ns": int,
            "step": int,
            "name": str,
            "shape": str,
            "seconds": float,
            "flops": float,
            "bytes": float,
        },
        foreign_keys=run_fk,
    )
    db["kernels"].create_index(["run_id", "ts_ns"])
    db["gpu_samples"].create(
        {
            "run_id": int,
            "ts_ns": int,
            "step": int,
            "device": int,
            "utilization_pct": float,
            "memory_used_bytes": int,
            "memory_total_bytes": int,
            "power_w": float,
            "sm_clock_mhz": float,
            "torch_allocated_bytes": int,
        },
        foreign_keys=run_fk,
    )
    db["gpu_samples"].create_index(["run_id", "ts_ns"])
    db["page_maps"].create(
        {
            "id": int,
            "run_id": int,
            "ts_ns": int,
            "step": int,
            "num_pages": int,
            "pages_owned": int,
            "pages_cached": int,
            "pages_free": int,
            "pages_evicted": int,
            "owners": bytes,  # zlib of little-endian int32 owners
        },
        pk="id",
        foreign_keys=run_fk,
    )
    db["page_maps"].create_index(["run_id", "step"])


_V1_STEP_COUNTERS = (
    "batch_size",
    "prefill_tokens",
    "decode_tokens",
    "running",
    "waiting",
    "pages_total",
    "pages_used",
    "pages_cached",
    "pages_free",
    "page_size",
    "tokens_held",
    "host_pages_used",
)


def _v2_liveness_and_metrics(db: Database) -> None:
    """Writer liveness (heartbeat, pid, host) so readers can tell a dead run from
    a live one, and a table of a run's final figures for outside tools."""
    runs = db["runs"]
    runs.add_column("heartbeat", float)  # time.time() of the writer's last flush
    runs.add_column("writer_pid", int)
    runs.add_column("writer_host", str)
    db["metrics"].create(
        {"run_id": int, "name": str, "value": float},
        pk=("run_id", "name"),
        foreign_keys=[("run_id", "runs", "id")],
    )


def _v3_watch(db: Database) -> None:
    """Watched vLLM/SGLang deployments: sources, block events, incidents, /metrics."""
    create_watch_tables(db)


def _v4_gpu_index(db: Database) -> None:
    """``gpu_samples.device`` -> ``gpu_index``: "device" names the execution device
    (``cpu``, ``cuda:N``) everywhere else; this column is NVML's GPU index."""
    db.execute("ALTER TABLE gpu_samples RENAME COLUMN device TO gpu_index")


def _v5_page_map_holds(db: Database) -> None:
    """Page maps keep who holds each page (shared pages included) and the prefix
    tree's device pages, so readers rebuild holder counts exactly at every step
    (NULL in maps recorded before: readers replay from the run's start)."""
    db["page_maps"].add_column("holds", bytes)  # zlib of int32 engine.events.encode_holds
    db["page_maps"].add_column("tree", bytes)  # zlib of int32 device pages in the tree


def _v6_watch_aggregates(db: Database) -> None:
    """What the watch views read, kept by the recorder as it writes (issue 23):
    live blocks, series, misses, histograms, duplication, shared prefixes; and a
    ``run_id`` index on ``watch_blocks``. Watch runs recorded before are marked
    stale, to be folded from their raw rows (``profiler.watch.fold.refold_stale``)."""
    create_aggregate_tables(db)
    create_stale_table(db)
    mark_stale(db.conn)


def _v7_watch_raw_unindexed(db: Database) -> None:
    """``watch_blocks`` without its ``run_id`` index: the views read the aggregates,
    and the index cost the recorder 40% of its insert rate."""
    drop_raw_run_index(db)


def _v8_watch_prefill_series(db: Database) -> None:
    """``watch_series.new_blocks`` and ``both_misses``: a window's shares of prefill
    (issue 23). Runs that hold all their raw rows are marked stale, to be folded
    again to fill them; NULL for runs trimmed by ``--keep-raw``."""
    add_prefill_columns(db)


def _v9_watch_forgotten_removals(db: Database) -> None:
    """``watch_source_stats.forgotten_removals``: removals the fold's fleet-wide
    memory of removed hashes let go of (issue 23); 0 for runs recorded before."""
    add_forgotten_removals(db)


def _v10_watch_stale_runs(db: Database) -> None:
    """``watch_agg_stale``: the runs whose aggregates a migration left to be folded
    again. Migrations no longer fold (the fold is the profiler's, above db/): 6 and 8
    mark the runs they change, and whoever opens the file to view or continue it
    folds them (``kvscope refold`` does it on its own). Files migrated past 8 before
    had been folded then, and have none."""
    create_stale_table(db)


MIGRATIONS: tuple[Callable[[Database], None], ...] = (
    _v1_initial,
    _v2_liveness_and_metrics,
    _v3_watch,
    _v4_gpu_index,
    _v5_page_map_holds,
    _v6_watch_aggregates,
    _v7_watch_raw_unindexed,
    _v8_watch_prefill_series,
    _v9_watch_forgotten_removals,
    _v10_watch_stale_runs,
)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(db: Database) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def migrate(db: Database, target: int = SCHEMA_VERSION) -> int:
    """Apply the migrations a database lacks, up to ``target``; returns its version.

    Raises KvscopeError for a database written by a newer kvscope.
    """
    current = schema_version(db)
    if current > SCHEMA_VERSION:
        raise KvscopeError(
            f"database schema version {current} is newer than this kvscope's "
            f"({SCHEMA_VERSION}); upgrade kvscope"
        )
    while current < target:
        db.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(db)  # another process may have migrated meanwhile
            if current < target:
                MIGRATIONS[current](db)
                current += 1
                db.execute(f"PRAGMA user_version = {current}")
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute("COMMIT")
        except BaseException:
            db.conn.rollback()
            raise
    return current
