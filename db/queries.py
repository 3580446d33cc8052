"""The read API every front end uses (TUI, Dash, reports, ``kvscope runs``).

Each function takes a source (a ``sqlite_utils.Database`` from ``db.store.open_db``,
a ``sqlite3.Connection``, or a path, opened read-side and closed again) and a
run id, and returns small frozen dataclasses (``dataclasses.asdict`` turns them
into dicts for JSON or a DataFrame). Times are seconds since the run's start
(``t_s``); a run's ``started_at`` is the wall clock at that start.

Figures are computed from counters with ``db.formulas``, the same functions the
live metrics use. Queries are safe to run while a writer writes (WAL mode).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlite_utils import Database

from db import formulas
from db.formulas import KernelStat, RunSummary, RunTotals
from db.schema import INCOMPLETE, RUNNING
from db.store import open_db
from engine.errors import KvscopeError
from engine.events import PAGE_FREE

Source = Database | sqlite3.Connection | str | os.PathLike

# A 'running' run whose writer has not written for this long is incomplete.
HEARTBEAT_STALE_S = 5.0

# Event kinds event_timeline returns unless told otherwise.
TIMELINE_KINDS = (
    "page_evicted",
    "page_offloaded",
    "page_reloaded",
    "request_preempted",
    "request_resumed",
)

__all__ = [
    "Comparison",
    "GpuPoint",
    "KernelStat",
    "PageBalance",
    "PageMatrix",
    "PageSnapshot",
    "Progress",
    "RequestRow",
    "RunInfo",
    "RunSummary",
    "StepPoint",
    "TimelineEvent",
    "compare_runs",
    "decode_owners",
    "event_timeline",
    "gpu_series",
    "kernel_stats",
    "latest_step",
    "list_runs",
    "page_accounting",
    "page_map_at",
    "page_maps",
    "requests_table",
    "resolve_status",
    "run_info",
    "run_summary",
    "step_series",
]


# --- results -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunInfo:
    run_id: int
    kind: str
    model: str | None
    status: str  # running | complete | interrupted | failed | incomplete
    started_at: float  # wall clock (time.time()) at the start
    duration_s: float  # wall time until the end, or until the writer's last heartbeat
    requests: int
    steps: int
    events_written: int
    dropped_events: int
    config: dict[str, Any]
    hardware: dict[str, Any]
    versions: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One time bucket of step summaries (one step when the run is short)."""

    t_s: float  # time of the bucket's last step
    step: int  # the bucket's last step
    steps: int  # step summaries in the bucket
    page_usage: float | None
    token_usage: float | None
    fragmentation_slots: float  # mean reserved-but-empty token slots
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    running: float  # means over the bucket
    waiting: float
    pages_used: float
    pages_cached: float
    host_pages_used: float
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    hit_rate: float | None  # None: no prefix lookups in the bucket


@dataclass(frozen=True, slots=True)
class PageSnapshot:
    step: int
    t_s: float
    owners: np.ndarray  # int32: request id >= 0, or engine.events.PAGE_* codes
    pages_owned: int
    pages_cached: int
    pages_free: int
    pages_evicted: int


@dataclass(frozen=True, slots=True)
class PageMatrix:
    """Page owners over time for a heatmap: ``owners[page_row, snapshot]``."""

    steps: list[int]
    t_s: list[float]
    owners: np.ndarray  # int32, shape (pages // page_stride, len(steps))
    page_stride: int  # row i shows page i * page_stride


@dataclass(frozen=True, slots=True)
class PageBalance:
    """The page events replayed up to one snapshot, beside the snapshot itself."""

    step: int
    t_s: float
    allocated: int  # page references handed out so far (a shared prefix page once per request)
    freed: int  # page references given back so far
    referenced: int  # distinct pages with references left: must equal ``owned``
    owned: int  # pages with an owner in the snapshot


@dataclass(frozen=True, slots=True)
class RequestRow:
    request_id: int
    status: str  # waiting | running | finished | rejected
    arrival_s: float | None
    queue_s: float | None  # arrival to first scheduling
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None  # arrival to finish
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    preemptions: int
    finish_reason: str | None
    rejected_reason: str | None


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    t_s: float
    step: int
    kind: str
    request_id: int | None
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class GpuPoint:
    """One time bucket of GPU samples of one device (means over the bucket)."""

    t_s: float
    device: int
    utilization_pct: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    torch_allocated_bytes: float | None


@dataclass(frozen=True, slots=True)
class Comparison:
    runs: list[RunInfo]
    summaries: list[RunSummary]
    config_diff: dict[str, list[Any]]  # config keys whose values differ, one value per run


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands, for followers polling the database."""

    step: int | None  # latest recorded step summary, None before the first
    t_s: float | None
    status: str
    events_written: int


# --- connections and run status --------------------------------------------------


@contextmanager
def _connection(source: Source) -> Iterator[sqlite3.Connection]:
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


def resolve_status(
    status: str,
    heartbeat: float | None,
    writer_pid: int | None,
    writer_host: str | None,
    now: float | None = None,
) -> str:
    """The status readers report: a stored 'running' whose writer is gone is 'incomplete'.

    The writer is gone when its heartbeat is older than HEARTBEAT_STALE_S (or
    missing), or when it ran on this host and its process no longer exists.
    """
    if status != RUNNING:
        return status
    now = time.time() if now is None else now
    if heartbeat is None or now - heartbeat > HEARTBEAT_STALE_S:
        return INCOMPLETE
    if writer_pid is not None and writer_host == socket.gethostname():
        try:
            os.kill(writer_pid, 0)
        except ProcessLookupError:
            return INCOMPLETE
        except PermissionError:
            pass  # alive, owned by another user
    return status


_RUN_COLUMNS = """
    r.id, r.kind, r.model, r.status, r.heartbeat, r.writer_pid, r.writer_host,
    r.started_at, r.ended_at, r.events_written, r.dropped_events,
    r.config, r.hardware, r.versions,
    (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.id),
    (SELECT COUNT(*) FROM steps s WHERE s.run_id = r.id)
"""


def _run_info(row: Sequence[Any]) -> RunInfo:
    (run_id, kind, model, status, heartbeat, pid, host, started_at, ended_at) = row[:9]
    (events_written, dropped, config, hardware, versions, requests, steps) = row[9:]
    end = ended_at if ended_at is not None else (heartbeat or started_at)
    return RunInfo(
        run_id=run_id,
        kind=kind,
        model=model,
        status=resolve_status(status, heartbeat, pid, host),
        started_at=started_at,
        duration_s=max(0.0, end - started_at),
        requests=requests,
        steps=steps,
        events_written=events_written or 0,
        dropped_events=dropped or 0,
        config=json.loads(config or "{}"),
        hardware=json.loads(hardware or "{}"),
        versions=json.loads(versions or "{}"),
    )


def list_runs(source: Source) -> list[RunInfo]:
    """Every run in the database, newest first."""
    with _connection(source) as conn:
        rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs r ORDER BY r.id DESC").fetchall()
    return [_run_info(row) for row in rows]


def run_info(source: Source, run_id: int) -> RunInfo:
    """One run's description; KvscopeError if the database has no such run."""
    with _connection(source) as conn:
        row = conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs r WHERE r.id = ?", (run_id,)
        ).fetchone()
    if row is None:
        raise KvscopeError(f"no run {run_id} in this database")
    return _run_info(row)


def _run_origin(conn: sqlite3.Connection, run_id: int) -> int:
    """The run's monotonic start (ns), the origin of every t_s."""
    row = conn.execute("SELECT start_ns FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise KvscopeError(f"no run {run_id} in this database")
    return row[0]


def _window(start_ns: int, since_s: float | None, until_s: float | None) -> tuple[int, int]:
    lo = start_ns + int(since_s * 1e9) if since_s is not None else -(2**62)
    hi = start_ns + int(until_s * 1e9) if until_s is not None else 2**62
    return lo, hi


# --- summary -----------------------------------------------------------------------


def run_summary(source: Source, run_id: int) -> RunSummary:
    """The run's headline figures (the same as the live metrics' summary)."""
    with _connection(source) as conn:
        info = run_info(conn, run_id)
        start_ns = _run_origin(conn, run_id)
        totals = RunTotals(dropped_events=info.dropped_events)
        (
            totals.requests,
            totals.requests_finished,
            totals.requests_rejected,
            output_tokens,
        ) = conn.execute(
            """SELECT COUNT(arrival_ns), COUNT(finished_ns), COUNT(rejected_reason),
                      SUM(CASE WHEN finished_ns IS NOT NULL THEN output_tokens END)
               FROM requests WHERE run_id = ?""",
            (run_id,),
        ).fetchone()
        totals.output_tokens = output_tokens or 0
        totals.ttfts = [
            row[0]
            for row in conn.execute(
                "SELECT ttft_s FROM requests WHERE run_id = ? AND ttft_s IS NOT NULL", (run_id,)
            )
        ]
        totals.tpots = conn.execute(
            """SELECT output_tokens, tpot_s FROM requests
               WHERE run_id = ? AND finished_ns IS NOT NULL AND tpot_s IS NOT NULL""",
            (run_id,),
        ).fetchall()
        counts = {
            kind: (count, queried or 0, hit or 0)
            for kind, count, queried, hit in conn.execute(
                """SELECT kind, COUNT(*), SUM(json_extract(payload, '$.queried_tokens')),
                          SUM(json_extract(payload, '$.hit_tokens'))
                   FROM events WHERE run_id = ? AND kind IN
                   ('prefix_lookup', 'page_evicted', 'page_offloaded', 'page_reloaded',
                    'request_preempted')
                   GROUP BY kind""",
                (run_id,),
            )
        }
        _, totals.prefix_queried_tokens, totals.prefix_hit_tokens = counts.get(
            "prefix_lookup", (0, 0, 0)
        )
        totals.evicted_pages = counts.get("page_evicted", (0,))[0]
        totals.offloaded_pages = counts.get("page_offloaded", (0,))[0]
        totals.reloaded_pages = counts.get("page_reloaded", (0,))[0]
        totals.preemptions = counts.get("request_preempted", (0,))[0]
        steps, last_ts, tokens_held, slots = conn.execute(
            """SELECT COUNT(*), MAX(ts_ns), SUM(tokens_held), SUM(pages_used * page_size)
               FROM steps WHERE run_id = ?""",
            (run_id,),
        ).fetchone()
        totals.steps = steps
        totals.elapsed_s = (last_ts - start_ns) / 1e9 if last_ts is not None else 0.0
        totals.tokens_held = tokens_held or 0
        totals.token_slots = slots or 0
        peak = conn.execute(
            """SELECT pages_used, pages_total FROM steps WHERE run_id = ? AND pages_total > 0
               ORDER BY pages_used * 1.0 / pages_total DESC LIMIT 1""",
            (run_id,),
        ).fetchone()
        totals.peak_page_usage = formulas.page_usage(*peak) if peak else None
    return formulas.summarize(run_id, info.status, totals)


# --- time series ---------------------------------------------------------------------


def step_series(
    source: Source,
    run_id: int,
    max_points: int = 500,
    since_s: float | None = None,
    until_s: float | None = None,
) -> list[StepPoint]:
    """Step summaries in time buckets, at most ``max_points`` of them, oldest first.

    The window [since_s, until_s] (seconds since the run's start; None = open)
    is cut into ``max_points`` equal buckets; empty buckets are left out. Token
    rates are wall-clock throughput (tokens / time covered by the bucket's steps,
    idle gaps included); hit_rate comes from the prefix lookups in the bucket.
    """
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        lo, hi = _window(start_ns, since_s, until_s)
        lo, hi = conn.execute(
            "SELECT MIN(ts_ns), MAX(ts_ns) FROM steps WHERE run_id = ? AND ts_ns BETWEEN ? AND ?",
            (run_id, lo, hi),
        ).fetchone()
        if lo is None:
            return []
        bucket = f"CAST((ts_ns - {lo}) * {int(max_points)} / ({hi} - {lo} + 1) AS INTEGER)"
        # The step before the window gives the first step in it its gap.
        rows = conn.execute(
            f"""WITH s AS (
                  SELECT *, ts_ns - LAG(ts_ns) OVER (ORDER BY step) AS gap_ns
                  FROM steps WHERE run_id = :run AND ts_ns <= :hi AND ts_ns >= COALESCE(
                    (SELECT MAX(ts_ns) FROM steps WHERE run_id = :run AND ts_ns < :lo), :lo))
                SELECT {bucket} AS b, MAX(step), MAX(ts_ns), COUNT(*),
                       SUM(prefill_tokens), SUM(decode_tokens),
                       SUM(COALESCE(gap_ns / 1e9, duration_s)),
                       SUM(running), SUM(waiting), SUM(pages_used), SUM(pages_total),
                       SUM(pages_cached), SUM(host_pages_used),
                       SUM(pages_used * page_size), SUM(tokens_held)
                FROM s WHERE ts_ns >= :lo GROUP BY b ORDER BY b""",
            {"run": run_id, "lo": lo, "hi": hi},
        ).fetchall()
        lookups = {
            b: (queried or 0, hit or 0)
            for b, queried, hit in conn.execute(
                f"""SELECT {bucket} AS b, SUM(json_extract(payload, '$.queried_tokens')),
                           SUM(json_extract(payload, '$.hit_tokens'))
                    FROM events WHERE run_id = ? AND kind = 'prefix_lookup'
                    AND ts_ns BETWEEN ? AND ? GROUP BY b""",
                (run_id, lo, hi),
            )
        }
    points = []
    for row in rows:
        (b, step, ts_ns, n, prefill, decode, seconds, running, waiting) = row[:9]
        (pages_used, pages_total, pages_cached, host_pages, slots, held) = row[9:]
        queried, hit = lookups.get(b, (0, 0))
        points.append(
            StepPoint(
                t_s=(ts_ns - start_ns) / 1e9,
                step=step,
                steps=n,
                page_usage=formulas.page_usage(pages_used, pages_total),
                token_usage=formulas.token_usage(held, slots),
                fragmentation_slots=formulas.internal_fragmentation(slots, held) / n,
                prefill_tokens_per_s=formulas.per_second(prefill, seconds),
                decode_tokens_per_s=formulas.per_second(decode, seconds),
                running=running / n,
                waiting=waiting / n,
                pages_used=pages_used / n,
                pages_cached=pages_cached / n,
                host_pages_used=host_pages / n,
                prefix_queried_tokens=queried,
                prefix_hit_tokens=hit,
                hit_rate=formulas.hit_rate(hit, queried),
            )
        )
    return points


def gpu_series(
    source: Source,
    run_id: int,
    max_points: int = 500,
    since_s: float | None = None,
    until_s: float | None = None,
) -> list[GpuPoint]:
    """GPU samples in at most ``max_points`` time buckets per device, oldest first.

    An empty list means the run had no GPU (front ends show "N/A (no GPU)").
    """
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        lo, hi = _window(start_ns, since_s, until_s)
        lo, hi = conn.execute(
            "SELECT MIN(ts_ns), MAX(ts_ns) FROM gpu_samples WHERE run_id = ? AND ts_ns BETWEEN ? AND ?",
            (run_id, lo, hi),
        ).fetchone()
        if lo is None:
            return []
        rows = conn.execute(
            f"""SELECT CAST((ts_ns - {lo}) * {int(max_points)} / ({hi} - {lo} + 1) AS INTEGER) AS b,
                       device, MAX(ts_ns), AVG(utilization_pct), AVG(memory_used_bytes),
                       AVG(memory_total_bytes), AVG(power_w), AVG(sm_clock_mhz),
                       AVG(torch_allocated_bytes)
                FROM gpu_samples WHERE run_id = ? AND ts_ns BETWEEN ? AND ?
                GROUP BY b, device ORDER BY b, device""",
            (run_id, lo, hi),
        ).fetchall()
    return [GpuPoint((row[2] - start_ns) / 1e9, row[1], *row[3:]) for row in rows]


# --- page maps ------------------------------------------------------------------------


def decode_owners(blob: bytes) -> np.ndarray:
    """A stored page map back to its int32 owners array."""
    return np.frombuffer(zlib.decompress(blob), dtype="<i4").astype(np.int32)


def page_map_at(source: Source, run_id: int, step: int) -> PageSnapshot | None:
    """The page-map snapshot nearest at or before ``step`` (the last one taken at
    that step), or None if there is none that early."""
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        row = conn.execute(
            """SELECT step, ts_ns, owners, pages_owned, pages_cached, pages_free, pages_evicted
               FROM page_maps WHERE run_id = ? AND step <= ?
               ORDER BY step DESC, id DESC LIMIT 1""",
            (run_id, step),
        ).fetchone()
    if row is None:
        return None
    step, ts_ns, blob, owned, cached, free, evicted = row
    return PageSnapshot(
        step, (ts_ns - start_ns) / 1e9, decode_owners(blob), owned, cached, free, evicted
    )


def page_maps(
    source: Source,
    run_id: int,
    max_snapshots: int = 200,
    max_pages: int | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
) -> PageMatrix:
    """Page owners across snapshots, for a pages x time heatmap.

    At most ``max_snapshots`` snapshots, evenly spaced over the window; with
    ``max_pages``, every ``page_stride``-th page so at most that many rows.
    Pages missing from a smaller snapshot read as PAGE_FREE.
    """
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        lo, hi = _window(start_ns, since_s, until_s)
        index = conn.execute(
            """SELECT id, step, ts_ns FROM page_maps WHERE run_id = ? AND ts_ns BETWEEN ? AND ?
               ORDER BY step, id""",
            (run_id, lo, hi),
        ).fetchall()
        if len(index) > max_snapshots:
            picks = np.unique(np.linspace(0, len(index) - 1, max_snapshots).round().astype(int))
            index = [index[i] for i in picks]
        blobs = dict(
            conn.execute(
                f"SELECT id, owners FROM page_maps WHERE id IN ({','.join('?' * len(index))})",
                [row[0] for row in index],
            ).fetchall()
        )
    columns = [decode_owners(blobs[row[0]]) for row in index]
    num_pages = max((len(c) for c in columns), default=0)
    stride = max(1, -(-num_pages // max_pages)) if max_pages else 1
    owners = np.full((num_pages, len(columns)), PAGE_FREE, dtype=np.int32)
    for j, column in enumerate(columns):
        owners[: len(column), j] = column
    return PageMatrix(
        steps=[row[1] for row in index],
        t_s=[(row[2] - start_ns) / 1e9 for row in index],
        owners=owners[::stride],
        page_stride=stride,
    )


def page_accounting(source: Source, run_id: int) -> list[PageBalance]:
    """PagesAllocated / PagesFreed replayed in time order, checked at every snapshot.

    A page shared by several requests (a prefix hit) is allocated once per
    request and freed once per request; it is in use while any reference is
    left. ``referenced == owned`` at every snapshot says the event stream and
    the page maps tell the same story (without sharing, ``allocated - freed``
    equals ``owned`` too).
    """
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        snapshots = conn.execute(
            "SELECT step, ts_ns, pages_owned FROM page_maps WHERE run_id = ? ORDER BY ts_ns, id",
            (run_id,),
        ).fetchall()
        changes = conn.execute(
            """SELECT ts_ns, kind = 'pages_allocated', payload FROM events
               WHERE run_id = ? AND kind IN ('pages_allocated', 'pages_freed')
               ORDER BY ts_ns, id""",
            (run_id,),
        ).fetchall()
    refs: dict[int, int] = {}
    allocated = freed = referenced = 0
    balances = []
    i = 0
    for step, ts_ns, owned in snapshots:
        while i < len(changes) and changes[i][0] <= ts_ns:
            _, is_alloc, payload = changes[i]
            pages = json.loads(payload)["pages"]
            for page in pages:
                before = refs.get(page, 0)
                after = before + (1 if is_alloc else -1)
                refs[page] = after
                referenced += (after > 0) - (before > 0)
            if is_alloc:
                allocated += len(pages)
            else:
                freed += len(pages)
            i += 1
        balances.append(
            PageBalance(step, (ts_ns - start_ns) / 1e9, allocated, freed, referenced, owned)
        )
    return balances


# --- requests, kernels, events -----------------------------------------------------------


def requests_table(source: Source, run_id: int) -> list[RequestRow]:
    """One row per request, by request id."""
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        rows = conn.execute(
            """SELECT request_id, arrival_ns, scheduled_ns, finished_ns, ttft_s, tpot_s,
                      prompt_tokens, output_tokens, cached_tokens, preemptions,
                      finish_reason, rejected_reason
               FROM requests WHERE run_id = ? ORDER BY request_id""",
            (run_id,),
        ).fetchall()

    def since(ts_ns: int | None, origin: int | None) -> float | None:
        return (ts_ns - origin) / 1e9 if ts_ns is not None and origin is not None else None

    table = []
    for (
        rid,
        arrival,
        scheduled,
        finished,
        ttft,
        tpot,
        prompt,
        output,
        cached,
        preempt,
        reason,
        rejected,
    ) in rows:
        if rejected is not None:
            status = "rejected"
        elif finished is not None:
            status = "finished"
        elif scheduled is not None:
            status = "running"
        else:
            status = "waiting"
        table.append(
            RequestRow(
                request_id=rid,
                status=status,
                arrival_s=since(arrival, start_ns),
                queue_s=since(scheduled, arrival),
                ttft_s=ttft,
                tpot_s=tpot,
                e2e_s=since(finished, arrival),
                prompt_tokens=prompt,
                output_tokens=output,
                cached_tokens=cached,
                preemptions=preempt or 0,
                finish_reason=reason,
                rejected_reason=rejected,
            )
        )
    return table


def kernel_stats(
    source: Source, run_id: int, since_s: float | None = None, until_s: float | None = None
) -> list[KernelStat]:
    """Per kernel name: calls, total and mean seconds, achieved TFLOP/s and GB/s,
    and their fraction of the device's peak when the run's hardware lists it
    (``peak_tflops``, ``peak_gbps``). Most total time first."""
    with _connection(source) as conn:
        info = run_info(conn, run_id)
        lo, hi = _window(_run_origin(conn, run_id), since_s, until_s)
        rows = conn.execute(
            """SELECT name, COUNT(*), SUM(seconds), SUM(flops), SUM(bytes) FROM kernels
               WHERE run_id = ? AND ts_ns BETWEEN ? AND ?
               GROUP BY name ORDER BY SUM(seconds) DESC""",
            (run_id, lo, hi),
        ).fetchall()
    peak_tflops = info.hardware.get("peak_tflops")
    peak_gbps = info.hardware.get("peak_gbps")
    return [
        formulas.kernel_stat(
            name, calls, seconds, flops or 0.0, nbytes or 0.0, peak_tflops, peak_gbps
        )
        for name, calls, seconds, flops, nbytes in rows
    ]


def event_timeline(
    source: Source,
    run_id: int,
    kinds: Sequence[str] = TIMELINE_KINDS,
    since_s: float | None = None,
    until_s: float | None = None,
    limit: int | None = 1000,
) -> list[TimelineEvent]:
    """Events of the given kinds (evictions, offloads, reloads, preemptions by
    default), oldest first; with ``limit``, only the latest ``limit`` of them."""
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        lo, hi = _window(start_ns, since_s, until_s)
        rows = conn.execute(
            f"""SELECT ts_ns, step, kind, request_id, payload FROM events
                WHERE run_id = ? AND kind IN ({",".join("?" * len(kinds))})
                AND ts_ns BETWEEN ? AND ? ORDER BY ts_ns DESC, id DESC LIMIT ?""",
            (run_id, *kinds, lo, hi, -1 if limit is None else limit),
        ).fetchall()
    return [
        TimelineEvent((ts_ns - start_ns) / 1e9, step, kind, rid, json.loads(payload or "{}"))
        for ts_ns, step, kind, rid, payload in reversed(rows)
    ]


# --- comparison and following -----------------------------------------------------------


def compare_runs(source: Source, run_ids: Sequence[int]) -> Comparison:
    """Summaries of several runs side by side, and the config keys that differ."""
    with _connection(source) as conn:
        infos = [run_info(conn, run_id) for run_id in run_ids]
        summaries = [run_summary(conn, run_id) for run_id in run_ids]
    keys = sorted({key for info in infos for key in info.config})
    diff = {}
    for key in keys:
        values = [info.config.get(key) for info in infos]
        if any(value != values[0] for value in values[1:]):
            diff[key] = values
    return Comparison(infos, summaries, diff)


def latest_step(source: Source, run_id: int) -> Progress:
    """The latest recorded step and the run's status: cheap enough to poll every second."""
    with _connection(source) as conn:
        start_ns = _run_origin(conn, run_id)
        status, heartbeat, pid, host, events_written = conn.execute(
            """SELECT status, heartbeat, writer_pid, writer_host, events_written
               FROM runs WHERE id = ?""",
            (run_id,),
        ).fetchone()
        row = conn.execute(
            "SELECT step, ts_ns FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,)
        ).fetchone()
    return Progress(
        step=row[0] if row else None,
        t_s=(row[1] - start_ns) / 1e9 if row else None,
        status=resolve_status(status, heartbeat, pid, host),
        events_written=events_written or 0,
    )
