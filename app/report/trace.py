"""A run as Chrome Trace Event JSON, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Kernel launches become complete ("X") slices, one track per kernel; each
request is a slice on its own track with its queued / prefill / decode phases
nested inside and preemptions as instants; KV usage, prefix hit rate, queue
lengths and page counts are counter ("C") tracks. Timestamps are microseconds
since the run's start.
"""

from __future__ import annotations

from typing import Any

from sqlite_utils import Database

from kvscope.db import queries
from kvscope.db.queries import event_timeline, run_info, step_series
from kvscope.engine.events import RequestPreempted, RequestResumed

KERNELS_PID, REQUESTS_PID, ENGINE_PID = 1, 2, 3

# Counter samples per track: enough to see every phase of a run, small enough
# that Perfetto opens a run of any length at once.
COUNTER_POINTS = 5000


def _us(ns: int) -> float:
    return ns / 1e3


def _meta(pid: int, name: str, tid: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "pid": pid, "args": {"name": name}}
    if tid is None:
        event["name"] = "process_name"
    else:
        event |= {"name": "thread_name", "tid": tid}
    return event


def _slice(name: str, pid: int, tid: int, start_ns: int, end_ns: int, **args: Any) -> dict:
    return {
        "name": name,
        "cat": "request" if pid == REQUESTS_PID else "kernel",
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": _us(start_ns),
        "dur": _us(end_ns - start_ns),
        "args": args,
    }


def _kernel_events(db: Database, run_id: int) -> list[dict]:
    """Kernel timings are stamped when they end: a slice runs ``seconds`` before it."""
    columns, rows = queries.raw_rows(db, run_id, "kernels")
    tracks: dict[str, int] = {}
    events = []
    for row in rows:
        k = dict(zip(columns, row, strict=True))
        tid = tracks.setdefault(k["name"], len(tracks) + 1)
        end_ns = round(k["t_s"] * 1e9)
        start_ns = end_ns - round(k["seconds"] * 1e9)
        events.append(
            _slice(
                k["name"],
                KERNELS_PID,
                tid,
                start_ns,
                end_ns,
                shape=k["shape"],
                step=k["step"],
                flops=k["flops"],
                bytes=k["bytes"],
            )
        )
    return (
        [_meta(KERNELS_PID, "kernels")]
        + [_meta(KERNELS_PID, name, tid) for name, tid in tracks.items()]
        + events
    )


def _request_events(db: Database, run_id: int) -> list[dict]:
    """A request's slice spans arrival to finish (or the last step while unfinished);
    its phases are children that share its endpoints exactly (integer ns)."""
    run_end = queries.last_step_ns(db, run_id) or 0
    events = [_meta(REQUESTS_PID, "requests")]
    for r in queries.request_times(db, run_id):
        if r.arrival_ns is None:
            continue
        if r.finished_ns is not None:
            end = r.finished_ns
        else:
            end = r.arrival_ns if r.rejected else max(run_end, r.arrival_ns)
        rid = r.request_id
        events.append(_meta(REQUESTS_PID, f"request {rid}", rid))
        events.append(_slice(f"request {rid}", REQUESTS_PID, rid, r.arrival_ns, end))
        marks = [r.arrival_ns, r.scheduled_ns, r.first_token_ns, end]
        for name, lo, hi in zip(("queued", "prefill", "decode"), marks, marks[1:], strict=False):
            if lo is not None and hi is not None and hi >= lo:
                events.append(_slice(name, REQUESTS_PID, rid, lo, hi))
    for e in event_timeline(
        db, run_id, kinds=(RequestPreempted.kind, RequestResumed.kind), limit=None
    ):
        events.append(
            {
                "name": e.kind.removeprefix("request_"),
                "cat": "request",
                "ph": "i",
                "s": "t",
                "pid": REQUESTS_PID,
                "tid": e.request_id,
                "ts": e.t_s * 1e6,
                "args": e.payload,
            }
        )
    return events


def _counter_events(db: Database, run_id: int) -> list[dict]:
    events = [_meta(ENGINE_PID, "engine")]
    for p in step_series(db, run_id, COUNTER_POINTS):
        tracks = {
            "KV usage (%)": {
                "pages": None if p.page_usage is None else 100 * p.page_usage,
                "tokens": None if p.token_usage is None else 100 * p.token_usage,
            },
            "prefix hit rate (%)": {"hit rate": None if p.hit_rate is None else 100 * p.hit_rate},
            "queues": {"running": p.running, "waiting": p.waiting},
            "pages": {"used": p.pages_used, "cached": p.pages_cached, "host": p.host_pages_used},
        }
        for name, values in tracks.items():
            args = {k: v for k, v in values.items() if v is not None}
            if args:
                events.append(
                    {
                        "name": name,
                        "ph": "C",
                        "pid": ENGINE_PID,
                        "tid": 0,
                        "ts": p.t_s * 1e6,
                        "args": args,
                    }
                )
    return events


def build_trace(db: Database, run_id: int) -> dict[str, Any]:
    """The whole trace as one JSON-able dict, events in time order (metadata first)."""
    info = run_info(db, run_id)
    events = _kernel_events(db, run_id) + _request_events(db, run_id) + _counter_events(db, run_id)
    meta = [e for e in events if e["ph"] == "M"]
    timed = sorted((e for e in events if e["ph"] != "M"), key=lambda e: (e["ts"], -e.get("dur", 0)))
    return {
        "traceEvents": meta + timed,
        "displayTimeUnit": "ms",
        "otherData": {
            "kvscope_run": run_id,
            "kind": info.kind,
            "model": info.model,
            "status": info.status,
            "started_at": info.started_at,
        },
    }
