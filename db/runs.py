"""Reads about whole runs: which runs there are, how one stands, its headline figures.

``run_info`` describes a run, ``latest_step`` and ``fingerprint`` are cheap
enough for followers to poll, ``run_summary`` computes the same figures as the
live metrics (through ``db.formulas``), and ``cost_device`` is the device
preset a run's cost model and %peak figures are read against.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from kvscope.db import formulas
from kvscope.db.events import tally
from kvscope.db.formulas import RunSummary, RunTotals
from kvscope.db.requests import request_progress
from kvscope.db.schema import INCOMPLETE, RUNNING
from kvscope.db.source import Position, Source, connection, run_origin, stored_json
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import PageEvicted, PageOffloaded, PageReloaded, RequestPreempted
from kvscope.engine.presets import Device, device_preset

# A 'running' run whose writer has not written for this long is incomplete.
HEARTBEAT_STALE_S = 5.0


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
    # A watch run's block events (one per hash stored or removed), as its live line and
    # every view count them: its sources' counters summed; None for other kinds.
    block_events: int | None = None

    @property
    def events(self) -> int:
        """The events a run list shows: a watch's block events, else the events written."""
        return self.events_written if self.block_events is None else self.block_events

    @property
    def subject(self) -> str | None:
        """What ran, for run lists and pickers: the model's file name, or a
        simulation's allocator."""
        if self.model:
            return PurePath(self.model).name
        if self.kind == "simulation" and self.config.get("allocator"):
            return f"{self.config['allocator']} allocator"
        return None


@dataclass(frozen=True, slots=True)
class LatestStep:
    """Where a run stands, for followers polling the database."""

    step: int | None  # latest recorded step summary, None before the first
    t_s: float | None
    status: str
    events_written: int


@dataclass(frozen=True, slots=True)
class Comparison:
    runs: list[RunInfo]
    summaries: list[RunSummary]
    config_diff: dict[str, list[Any]]  # config keys whose values differ, one value per run


@dataclass(frozen=True, slots=True)
class WriterLiveness:
    """Whether the writer of a run left 'running' is still there: the one rule readers
    (is the run incomplete?) and a watch started again (may it take the run over?)
    both decide by."""

    fresh: bool  # its heartbeat is at most HEARTBEAT_STALE_S old
    process: bool | None  # its process exists; None: on another host, or not recorded

    @property
    def gone(self) -> bool:
        """As readers report it: a stale heartbeat, or a process no longer there."""
        return not self.fresh or self.process is False

    @property
    def certainly_gone(self) -> bool:
        """Nothing can write the run any more: its heartbeat is stale and no process of
        it is seen (a slow writer whose process lives is not taken over)."""
        return not self.fresh and not self.process


def writer_liveness(
    heartbeat: float | None,
    writer_pid: int | None,
    writer_host: str | None,
    now: float | None = None,
) -> WriterLiveness:
    now = time.time() if now is None else now
    fresh = heartbeat is not None and now - heartbeat <= HEARTBEAT_STALE_S
    process = None
    if writer_pid is not None and writer_host == socket.gethostname():
        try:
            os.kill(writer_pid, 0)
            process = True
        except ProcessLookupError:
            process = False
        except PermissionError:
            process = True  # alive, owned by another user
    return WriterLiveness(fresh, process)


def resolve_status(
    status: str,
    heartbeat: float | None,
    writer_pid: int | None,
    writer_host: str | None,
    now: float | None = None,
) -> str:
    """The status readers report: a stored 'running' whose writer is gone is 'incomplete'."""
    if status != RUNNING:
        return status
    return INCOMPLETE if writer_liveness(heartbeat, writer_pid, writer_host, now).gone else status


_RUN_COLUMNS = """
    r.id, r.kind, r.model, r.status, r.heartbeat, r.writer_pid, r.writer_host,
    r.started_at, r.ended_at, r.events_written, r.dropped_events,
    r.config, r.hardware, r.versions,
    (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.id),
    (SELECT COUNT(*) FROM steps s WHERE s.run_id = r.id),
    (SELECT SUM(w.block_events) FROM watch_sources w WHERE w.run_id = r.id AND w.kind = 'events')
"""


def _run_info(row: Sequence[Any]) -> RunInfo:
    (run_id, kind, model, status, heartbeat, pid, host, started_at, ended_at) = row[:9]
    (events_written, dropped, config, hardware, versions, requests, steps, blocks) = row[9:]
    end = ended_at if ended_at is not None else (heartbeat or started_at)
    config = stored_json(config, run_id, "config")
    if kind == "simulation" and not requests:  # simulated requests have no request rows
        requests = int(config.get("requests", 0))
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
        config=config,
        hardware=stored_json(hardware, run_id, "hardware"),
        versions=stored_json(versions, run_id, "versions"),
        block_events=(blocks or 0) if kind == "watch" else None,
    )


def list_runs(source: Source) -> list[RunInfo]:
    """Every run in the database, newest first."""
    with connection(source) as conn:
        rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs r ORDER BY r.id DESC").fetchall()
    return [_run_info(row) for row in rows]


def run_info(source: Source, run_id: int) -> RunInfo:
    """One run's description; KvscopeError if the database has no such run."""
    with connection(source) as conn:
        row = conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs r WHERE r.id = ?", (run_id,)
        ).fetchone()
    if row is None:
        raise KvscopeError(f"no run {run_id} in this database")
    return _run_info(row)


def newest_run(source: Source, after: int = 0) -> int | None:
    """The newest run's id if it is above ``after`` (a run started after a baseline)."""
    with connection(source) as conn:
        (newest,) = conn.execute("SELECT MAX(id) FROM runs").fetchone()
    return newest if newest is not None and newest > after else None


def choose_run(source: Source, run_id: int | None) -> int:
    """``run_id`` if the database has it, else (None) its newest run; one clear
    KvscopeError line otherwise."""
    with connection(source) as conn:
        if run_id is None:
            run_id = newest_run(conn)
            if run_id is None:
                raise KvscopeError("the database has no runs yet")
        run_origin(conn, run_id)
    return run_id


def latest_step(source: Source, run_id: int) -> LatestStep:
    """The latest recorded step and the run's status: cheap enough to poll every second."""
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        status, heartbeat, pid, host, events_written = conn.execute(
            """SELECT status, heartbeat, writer_pid, writer_host, events_written
               FROM runs WHERE id = ?""",
            (run_id,),
        ).fetchone()
        row = conn.execute(
            "SELECT step, ts_ns FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,)
        ).fetchone()
    return LatestStep(
        step=row[0] if row else None,
        t_s=(row[1] - start_ns) / 1e9 if row else None,
        status=resolve_status(status, heartbeat, pid, host),
        events_written=events_written or 0,
    )


def fingerprint(source: Source, run_id: int | None) -> dict[str, Any]:
    """A cheap fingerprint of the database as a page sees it: pages redraw only
    when it changes, so an idle dashboard costs one small query per refresh."""
    with connection(source) as conn:
        runs, newest = conn.execute("SELECT COUNT(*), MAX(id) FROM runs").fetchone()
        result: dict[str, Any] = {"runs": runs, "newest": newest, "run": run_id}
        if run_id is None:
            return result
        try:
            progress = latest_step(conn, run_id)
        except KvscopeError:
            return result
    return result | {
        "step": progress.step,
        "events": progress.events_written,
        "status": progress.status,
    }


def page_size(source: Source, run_id: int) -> int | None:
    """Tokens per page, as the run's step summaries report it."""
    with connection(source) as conn:
        row = conn.execute(
            "SELECT page_size FROM steps WHERE run_id = ? LIMIT 1", (run_id,)
        ).fetchone()
    return row[0] if row else None


def cost_device(info: RunInfo) -> Device | None:
    """The device preset the run's cost model used (``--cost-device``), None when
    its config names none or an unknown one.

    Recorded as ``cost_device``; runs recorded before that name carry it as
    ``device`` (which then hid the engine's execution device).
    """
    key = "cost_device" if "cost_device" in info.config else "device"
    name = info.config.get(key)
    if isinstance(name, str):
        try:
            return device_preset(name)
        except KvscopeError:
            pass
    return None


def run_summary(source: Source, run_id: int) -> RunSummary:
    """The run's headline figures (the same as the live metrics' summary)."""
    with connection(source) as conn:
        info = run_info(conn, run_id)
        start_ns = run_origin(conn, run_id)
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
        totals.output_tokens = (output_tokens or 0) + _unfinished_tokens(conn, run_id)
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
        # the same function as the TUI's running counters, over the whole run
        counts = tally(conn, run_id)
        totals.prefix_queried_tokens = counts.prefix_queried_tokens
        totals.prefix_hit_tokens = counts.prefix_hit_tokens
        totals.evicted_pages = counts.churn[PageEvicted.kind]
        totals.offloaded_pages = counts.churn[PageOffloaded.kind]
        totals.reloaded_pages = counts.churn[PageReloaded.kind]
        totals.preemptions = counts.churn[RequestPreempted.kind]
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
        if info.kind == "simulation":
            _simulation_totals(conn, run_id, info, totals)
    return formulas.summarize(run_id, info.status, totals)


def _unfinished_tokens(conn: Any, run_id: int) -> int:
    """Output tokens of requests that had not finished by the run's last step (an
    interrupted run): the tokens the progress line counted, derived from their
    events as the TUI derives them (db.requests.request_progress)."""
    ids = [
        rid
        for (rid,) in conn.execute(
            """SELECT request_id FROM requests WHERE run_id = ? AND finished_ns IS NULL
               AND first_token_ns IS NOT NULL""",
            (run_id,),
        )
    ]
    last = conn.execute(
        "SELECT step, ts_ns FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,)
    ).fetchone()
    if not ids or last is None:
        return 0
    progress = request_progress(conn, Position(run_id, last[0], last[1]), ids)
    return sum(p.output_tokens for p in progress.values())


def _simulation_totals(conn: Any, run_id: int, info: RunInfo, totals: RunTotals) -> None:
    """A ``kvscope simulate`` run has no request events: its requests and preemptions
    are the figures simulate printed (kept in its config by app/sim_record.py), and
    its output tokens the tokens its steps decoded (one per running request a step,
    the throughput line)."""
    config = info.config
    requests = int(config.get("requests", 0))
    totals.requests = totals.requests_finished = requests
    totals.preemptions = int(config.get("preemptions", 0))
    decoded = conn.execute(
        "SELECT SUM(decode_tokens) FROM steps WHERE run_id = ?", (run_id,)
    ).fetchone()[0]
    totals.output_tokens = int(decoded or 0)


def compare_runs(source: Source, run_ids: Sequence[int]) -> Comparison:
    """Summaries of several runs side by side, and the config keys that differ."""
    with connection(source) as conn:
        infos = [run_info(conn, run_id) for run_id in run_ids]
        summaries = [run_summary(conn, run_id) for run_id in run_ids]
    keys = sorted({key for info in infos for key in info.config})
    diff = {}
    for key in keys:
        values = [info.config.get(key) for info in infos]
        if any(value != values[0] for value in values[1:]):
            diff[key] = values
    return Comparison(infos, summaries, diff)
