"""What the dashboard and the reports read beyond ``db.queries``.

Every function takes an open database (see ``reader``) and a run id and returns
small frozen dataclasses. Anything that grows with the run is aggregated in
SQL (time buckets, counts) so a page stays fast on a run of a million events.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from operator import attrgetter
from typing import Any

import numpy as np
from sqlite_utils import Database

from db.queries import TIMELINE_KINDS, RequestRow, RunInfo, StepPoint, latest_step
from db.store import open_db
from engine.errors import KvscopeError
from engine.presets import Device, device_preset


@contextmanager
def reader(db_path: str | os.PathLike[str]) -> Iterator[Database]:
    """One read connection for one callback or report (closed afterwards).

    Raises KvscopeError when there is no database at ``db_path``: readers never
    create one.
    """
    db = open_db(db_path, create=False)
    try:
        yield db
    finally:
        db.conn.close()


def _origin(db: Database, run_id: int) -> int:
    row = db.execute("SELECT start_ns FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise KvscopeError(f"no run {run_id} in this database")
    return row[0]


# --- what changed ------------------------------------------------------------------


def choose_run(db: Database, run_id: int | None) -> int:
    """``run_id`` if the database has it, else (None) its newest run; one clear
    KvscopeError line otherwise."""
    if run_id is None:
        run_id = db.execute("SELECT MAX(id) FROM runs").fetchone()[0]
        if run_id is None:
            raise KvscopeError("the database has no runs yet")
        return run_id
    _origin(db, run_id)
    return run_id


def version(db: Database, run_id: int | None) -> dict[str, Any]:
    """A cheap fingerprint of the database as a page sees it: pages redraw only
    when it changes, so an idle dashboard costs one small query per refresh."""
    runs, newest = db.execute("SELECT COUNT(*), MAX(id) FROM runs").fetchone()
    fingerprint: dict[str, Any] = {"runs": runs, "newest": newest, "run": run_id}
    if run_id is not None:
        try:
            progress = latest_step(db, run_id)
        except KvscopeError:
            return fingerprint
        fingerprint |= {
            "step": progress.step,
            "events": progress.events_written,
            "status": progress.status,
        }
    return fingerprint


def page_size(db: Database, run_id: int) -> int | None:
    """Tokens per page, as the run's step summaries report it."""
    row = db.execute("SELECT page_size FROM steps WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
    return row[0] if row else None


# --- prefix cache --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CachedSources:
    """Tokens served from cache per step-series bucket, by where they were held."""

    t_s: list[float]
    device_tokens: list[int]  # prefix-cache hits on device pages
    host_tokens: list[int]  # tokens of pages reloaded from the host tier


def cached_sources(db: Database, run_id: int, points: Sequence[StepPoint]) -> CachedSources:
    """Split ``points``' cached tokens by tier. A bucket of the step series ends at
    its ``t_s``; a reload belongs to the first bucket ending at or after it."""
    ends = np.array([p.t_s for p in points], dtype=np.float64)
    start_ns = _origin(db, run_id)
    reloads = np.array(
        [
            row[0]
            for row in db.execute(
                "SELECT ts_ns FROM events WHERE run_id = ? AND kind = 'page_reloaded'", (run_id,)
            )
        ],
        dtype=np.int64,
    )
    buckets = np.searchsorted(ends, (reloads - start_ns) / 1e9, side="left")
    per_bucket = np.bincount(buckets[buckets < len(ends)], minlength=len(ends))
    tokens_per_page = page_size(db, run_id) or 0
    return CachedSources(
        t_s=ends.tolist(),
        device_tokens=[p.prefix_hit_tokens for p in points],
        host_tokens=(per_bucket * tokens_per_page).tolist(),
    )


# --- eviction and offload --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventCounts:
    """Events per kind in equal time buckets from the run's start."""

    t_s: list[float]  # bucket centres
    bucket_s: float
    counts: dict[str, list[int]]  # kind -> count per bucket (only kinds that occurred)


def event_counts(
    db: Database, run_id: int, kinds: Sequence[str] = TIMELINE_KINDS, max_points: int = 200
) -> EventCounts:
    """How many of each kind happened in each of at most ``max_points`` buckets,
    counted in SQL so the cost does not grow with what is sent to the browser."""
    start_ns = _origin(db, run_id)
    marks = ",".join("?" * len(kinds))
    end_ns = db.execute(
        f"""SELECT MAX(t) FROM (
              SELECT MAX(ts_ns) AS t FROM steps WHERE run_id = ?1
              UNION ALL SELECT MAX(ts_ns) FROM events WHERE run_id = ?1 AND kind IN ({marks}))""",
        (run_id, *kinds),
    ).fetchone()[0]
    if end_ns is None:
        return EventCounts([], 0.0, {})
    width_ns = max(1, -(-(end_ns - start_ns + 1) // max_points))
    n = -(-(end_ns - start_ns + 1) // width_ns)
    counts: dict[str, list[int]] = {}
    for bucket, kind, count in db.execute(
        f"""SELECT (ts_ns - ?2) / ?3 AS b, kind, COUNT(*) FROM events
            WHERE run_id = ?1 AND kind IN ({marks}) GROUP BY b, kind""",
        (run_id, start_ns, width_ns, *kinds),
    ):
        counts.setdefault(kind, [0] * n)[min(max(bucket, 0), n - 1)] += count
    t_s = ((np.arange(n) + 0.5) * width_ns / 1e9).tolist()
    return EventCounts(t_s, width_ns / 1e9, {k: counts[k] for k in kinds if k in counts})


def _device(info: RunInfo) -> Device | None:
    name = info.config.get("device")
    if not isinstance(name, str):
        return None
    try:
        return device_preset(name)
    except KvscopeError:
        return None


@dataclass(frozen=True, slots=True)
class TransferCost:
    """Seconds per page of one way to get a page's KV back (or out)."""

    action: str  # offload | reload | recompute
    samples: int  # measurements behind ``measured_s``
    measured_s: float | None
    predicted_s: float | None  # the cost model's figure; None when its inputs were not recorded


def transfer_costs(db: Database, info: RunInfo) -> list[TransferCost]:
    """Measured seconds per page beside the cost model's (engine.sizing's
    recompute-vs-load model: bytes over the host link, 2P FLOPs per token).

    Transfers are measured per event. Recompute is the marginal cost of a
    prefill token, fitted by least squares to step durations against prefill
    and decode tokens, times the page size. Predictions need the run's config
    to name a ``device`` preset and carry ``kv_bytes_per_token`` (transfers)
    or ``params`` (recompute).
    """
    run_id = info.run_id
    tokens_per_page = page_size(db, run_id) or info.config.get("page_size")
    device = _device(info)
    kv_bytes = info.config.get("kv_bytes_per_token")
    params = info.config.get("params")
    transfer_s = (
        tokens_per_page * kv_bytes / (device.pcie_gbps * 1e9)
        if device and kv_bytes and tokens_per_page
        else None
    )
    recompute_s = (
        tokens_per_page * 2 * params / (device.fp16_tflops * 1e12)
        if device and params and tokens_per_page
        else None
    )
    costs = []
    for action in ("offload", "reload"):
        count, mean = db.execute(
            """SELECT COUNT(*), AVG(json_extract(payload, '$.seconds')) FROM events
               WHERE run_id = ? AND kind = ?""",
            (run_id, f"page_{action}ed"),
        ).fetchone()
        costs.append(TransferCost(action, count, mean, transfer_s))
    samples, per_token = _prefill_seconds_per_token(db, run_id)
    measured = per_token * tokens_per_page if per_token and tokens_per_page else None
    costs.append(TransferCost("recompute", samples, measured, recompute_s))
    return costs


def _prefill_seconds_per_token(
    db: Database, run_id: int, max_steps: int = 20_000
) -> tuple[int, float | None]:
    """(steps used, marginal seconds per prefill token), from an evenly thinned
    sample of steps so the fit costs the same on any run."""
    (steps,) = db.execute("SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,)).fetchone()
    every = max(1, steps // max_steps)
    rows = np.array(
        db.execute(
            """SELECT duration_s, prefill_tokens, decode_tokens FROM steps
               WHERE run_id = ? AND step % ? = 0""",
            (run_id, every),
        ).fetchall(),
        dtype=np.float64,
    ).reshape(-1, 3)
    design = np.column_stack([np.ones(len(rows)), rows[:, 1], rows[:, 2]])
    if len(rows) < 3 or np.linalg.matrix_rank(design) < 3:
        return len(rows), None
    coef = np.linalg.lstsq(design, rows[:, 0], rcond=None)[0]
    return len(rows), float(coef[1]) if coef[1] > 0 else None


# --- kernels ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DevicePeaks:
    """The roofline's ceilings: the run's measured device, else its named preset."""

    tflops: float | None
    gbps: float | None
    source: str


def device_peaks(info: RunInfo) -> DevicePeaks:
    hardware = info.hardware
    if hardware.get("peak_tflops") or hardware.get("peak_gbps"):
        gpus = hardware.get("gpus") or [{}]
        name = gpus[0].get("name", "this run's GPU")
        return DevicePeaks(hardware.get("peak_tflops"), hardware.get("peak_gbps"), name)
    device = _device(info)
    if device is not None:
        return DevicePeaks(device.fp16_tflops, device.hbm_gbps, f"preset {device.name}")
    return DevicePeaks(None, None, "unknown device")


# --- one request ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """One request's pages and tokens over its life."""

    request_id: int
    pages_t_s: list[float]
    pages: list[int]  # pages held after each allocation or release
    tokens_t_s: list[float]
    tokens: list[int | None]  # tokens held at its lifecycle events (None: a gap in the line)
    marks: list[tuple[float, str]]  # (t_s, event kind) of its lifecycle events


_REQUEST_KINDS = (
    "request_arrived",
    "request_scheduled",
    "chunk_scheduled",
    "first_token",
    "pages_allocated",
    "pages_freed",
    "request_preempted",
    "request_resumed",
    "request_finished",
)
_MARK_KINDS = frozenset(_REQUEST_KINDS) - {"chunk_scheduled", "pages_allocated", "pages_freed"}


def request_trace(db: Database, run_id: int, request_id: int) -> RequestTrace:
    """Read from the request's own events, looked up by kind within its lifetime
    so the (run, kind, time) index serves it on a run of any size."""
    start_ns = _origin(db, run_id)
    # Its lifetime ends with the step summary of the step it finished in: pages
    # it releases on finishing may be stamped after its RequestFinished.
    life = db.execute(
        """SELECT arrival_ns, (SELECT MIN(s.ts_ns) FROM steps s
                               WHERE s.run_id = r.run_id AND s.ts_ns >= r.finished_ns)
           FROM requests r WHERE run_id = ? AND request_id = ?""",
        (run_id, request_id),
    ).fetchone()
    if life is None:
        raise KvscopeError(f"no request {request_id} in run {run_id}")
    lo = life[0] if life[0] is not None else -(2**62)
    hi = life[1] if life[1] is not None else 2**62
    rows = db.execute(
        f"""SELECT ts_ns, kind, payload FROM events
            WHERE run_id = ? AND kind IN ({",".join("?" * len(_REQUEST_KINDS))})
            AND ts_ns BETWEEN ? AND ? AND request_id = ? ORDER BY ts_ns, id""",
        (run_id, *_REQUEST_KINDS, lo, hi, request_id),
    ).fetchall()
    held = prompt = 0
    trace = RequestTrace(request_id, [], [], [], [], [])
    for ts_ns, kind, payload in rows:
        t_s = (ts_ns - start_ns) / 1e9
        values = json.loads(payload or "{}")
        if kind in ("pages_allocated", "pages_freed"):
            held += len(values["pages"]) * (1 if kind == "pages_allocated" else -1)
            trace.pages_t_s.append(t_s)
            trace.pages.append(held)
        for tokens in _tokens_after(kind, values, prompt):
            trace.tokens_t_s.append(t_s)
            trace.tokens.append(tokens)
        prompt = values.get("prompt_tokens", prompt)
        if kind in _MARK_KINDS:
            trace.marks.append((t_s, kind))
    return trace


def _tokens_after(kind: str, values: dict[str, Any], prompt: int) -> tuple[int | None, ...]:
    """Points of the tokens line right after one of the request's events; None
    breaks the line where the count in between is not recorded (decoding up to
    a preemption, the recompute after it)."""
    if kind == "request_arrived":
        return (0,)
    if kind == "chunk_scheduled":
        return (values["start"] + values["tokens"],)
    if kind == "first_token":
        return (prompt + 1,)
    if kind == "request_preempted":
        return (None, 0, None)
    if kind == "request_finished":
        return (values["prompt_tokens"] + values["output_tokens"],)
    return ()


# --- the requests table ----------------------------------------------------------------------

_FILTER_PART = re.compile(
    r"\{(?P<column>\w+)\}\s*(?P<case>[si])?(?P<op>contains|datestartswith|eq|ne|le|lt|ge|gt|"
    r"<=|>=|!=|=|<|>)\s*(?P<value>.+)"
)
_COMPARE = {
    "eq": lambda a, b: a == b,
    "=": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "!=": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "<": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "<=": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    ">": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    ">=": lambda a, b: a >= b,
}


def _literal(text: str) -> str | float:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"`":
        return text[1:-1]
    try:
        return float(text)
    except ValueError:
        return text


_REQUEST_FIELDS = frozenset(f.name for f in fields(RequestRow))


def _clause(part: str) -> Callable[[RequestRow], bool] | None:
    """One clause of a DataTable filter query as a test of a row, parsed once;
    None for a clause it cannot read (which then filters nothing)."""
    m = _FILTER_PART.fullmatch(part.strip())
    if m is None or m["column"] not in _REQUEST_FIELDS:
        return None
    column, op, wanted = m["column"], m["op"], _literal(m["value"])
    if op in ("contains", "datestartswith"):
        fold = m["case"] == "i"
        needle = str(wanted).lower() if fold else str(wanted)

        def text_test(row: RequestRow) -> bool:
            value = getattr(row, column)
            if value is None:
                return False
            text = str(value).lower() if fold else str(value)
            return text.startswith(needle) if op == "datestartswith" else needle in text

        return text_test
    compare = _COMPARE[op]

    def value_test(row: RequestRow) -> bool:
        value = getattr(row, column)
        if value is None:
            return False
        if isinstance(value, str) != isinstance(wanted, str):
            return compare(str(value), str(wanted))
        return compare(value, wanted)

    return value_test


def filter_requests(
    rows: Sequence[RequestRow], filter_query: str = "", sort_by: Sequence[dict] = ()
) -> list[RequestRow]:
    """The requests table filtered and sorted server-side with DataTable's query
    syntax (the browser only ever receives one page of a run with many requests)."""
    tests = [t for part in (filter_query or "").split(" && ") if (t := _clause(part))]
    kept = [row for row in rows if all(test(row) for test in tests)]
    for key in reversed(sort_by or ()):
        column = key["column_id"]
        if column not in _REQUEST_FIELDS:
            continue
        present = [row for row in kept if getattr(row, column) is not None]
        missing = [row for row in kept if getattr(row, column) is None]
        present.sort(key=attrgetter(column), reverse=key["direction"] == "desc")
        kept = present + missing
    return kept


def request_record(row: RequestRow) -> dict[str, Any]:
    """One DataTable record (``id`` is the row id DataTable selects by)."""
    return asdict(row) | {"id": row.request_id}


# --- raw tables (reports) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestTimes:
    """A request's lifecycle in nanoseconds since the run's start (None: not yet)."""

    request_id: int
    arrival_ns: int | None
    scheduled_ns: int | None
    first_token_ns: int | None
    finished_ns: int | None
    rejected: bool


def request_times(db: Database, run_id: int) -> list[RequestTimes]:
    """Exact integer times, so spans built from them nest without rounding."""
    start_ns = _origin(db, run_id)
    rows = db.execute(
        """SELECT request_id, arrival_ns - ?1, scheduled_ns - ?1, first_token_ns - ?1,
                  finished_ns - ?1, rejected_reason IS NOT NULL
           FROM requests WHERE run_id = ?2 ORDER BY request_id""",
        (start_ns, run_id),
    )
    return [RequestTimes(*row[:5], bool(row[5])) for row in rows]


def last_step_ns(db: Database, run_id: int) -> int | None:
    """The latest step summary, in nanoseconds since the run's start."""
    row = db.execute("SELECT MAX(ts_ns) FROM steps WHERE run_id = ?", (run_id,)).fetchone()
    return None if row[0] is None else row[0] - _origin(db, run_id)


_RAW_TABLES = {
    "steps": "step, batch_size, prefill_tokens, decode_tokens, running, waiting, pages_total, "
    "pages_used, pages_cached, pages_free, page_size, tokens_held, host_pages_used, duration_s",
    "kernels": "step, name, shape, seconds, flops, bytes",
    "gpu_samples": "step, device, utilization_pct, memory_used_bytes, memory_total_bytes, "
    "power_w, sm_clock_mhz, torch_allocated_bytes",
    "events": "step, kind, request_id, payload",
}


def raw_rows(db: Database, run_id: int, table: str) -> tuple[list[str], Iterator[tuple]]:
    """(column names, rows) of one table at full resolution, oldest first,
    with ``t_s`` (seconds since the run's start) first. Rows stream from SQLite."""
    start_ns = _origin(db, run_id)
    cursor = db.execute(
        f"SELECT (ts_ns - ?) / 1e9 AS t_s, {_RAW_TABLES[table]} FROM {table} "
        "WHERE run_id = ? ORDER BY ts_ns, rowid",
        (start_ns, run_id),
    )
    return [d[0] for d in cursor.description], iter(cursor)
