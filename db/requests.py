"""Reads about requests: the table of every request, the requests at a position,
one request's trace, and exact lifecycle times.

Output tokens and TPOT are recorded when a request finishes; while it runs,
``request_progress`` derives them from its recorded events, at no recording
cost: after its first token a request gains one token per engine step, except
in the steps it spends preempted (from the preemption up to its resumption,
whose step samples a token once the recompute fits in it) and in recompute
chunks that stop short of its sequence (recorded while they cover the
prompt). At the step a request finished the derived figures equal the
recorded ones; a recompute longer than a step's token budget past the prompt
is the one case it runs ahead, by the unrecorded chunks, until the request
finishes.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvscope.db.miss_reasons import MissCounts, request_miss_reasons
from kvscope.db.page_replay import step_pages
from kvscope.db.page_states import StepPages
from kvscope.db.source import NO_END, NO_START, Position, Source, connection, kinds_sql, run_origin
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import (
    ChunkScheduled,
    FirstToken,
    PagesAllocated,
    PagesFreed,
    PrefixLookup,
    RequestArrived,
    RequestFinished,
    RequestPreempted,
    RequestResumed,
    RequestScheduled,
)


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One request as it stands at the newest recorded step."""

    request_id: int
    status: str  # waiting | running | finished | rejected
    arrival_s: float | None
    queue_s: float | None  # arrival to first scheduling
    ttft_s: float | None
    tpot_s: float | None  # so far while running
    e2e_s: float | None  # arrival to finish
    prompt_tokens: int | None
    output_tokens: int | None  # so far while running
    cached_tokens: int | None
    preemptions: int
    finish_reason: str | None
    rejected_reason: str | None
    # Its missed prompt tokens by reason, at its first admission (db/miss_reasons.py): a
    # re-admission after a recompute preemption records none (nor counts in the hit rate).
    missed_cold: int | None = None
    missed_capacity: int | None = None
    missed_granularity: int | None = None
    missed_last_token: int | None = None
    # Pages it holds at the newest step, split into private and shared, and those that
    # would go back to the free list if it finished now (db/page_states.py); 0 once it
    # holds none, None where the recording cannot say (a simulation, an old recording).
    pages: int | None = None
    private_pages: int | None = None
    shared_pages: int | None = None
    would_free: int | None = None


@dataclass(frozen=True, slots=True)
class RequestState:
    """One request as it stood at a position (output tokens and TPOT so far while
    it runs; None before its first token)."""

    request_id: int
    state: str  # waiting | running | preempted | finished | rejected
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    pages: int
    ttft_s: float | None
    tpot_s: float | None
    preemptions: int
    # pages held (``pages``) split into private and shared, and those that would go
    # back to the free list if it finished now (db/page_states.py)
    private_pages: int = 0
    shared_pages: int = 0
    would_free: int = 0
    misses: MissCounts | None = None  # its missed tokens by reason so far (db/miss_reasons.py)


@dataclass(frozen=True, slots=True)
class RequestProgress:
    """A request's output so far, derived from its events (see the module docstring)."""

    output_tokens: int
    tpot_s: float | None  # None with a single token


def request_progress(
    conn: sqlite3.Connection, at: Position, request_ids: Iterable[int]
) -> dict[int, RequestProgress]:
    """Output tokens and TPOT at the position of those of ``request_ids`` that had
    their first token by then."""
    ids = sorted(set(request_ids))
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    rows = conn.execute(
        f"""SELECT step, ts_ns, kind, request_id, payload FROM events
            WHERE run_id = ? AND kind IN ({kinds_sql(_PROGRESS_KINDS)})
            AND step <= ? AND ts_ns <= ? AND request_id IN ({marks})
            ORDER BY step, ts_ns, id""",
        (at.run_id, at.step, at.ts_ns, *ids),
    ).fetchall()
    first: dict[int, tuple[int, int]] = {}  # request -> (step, ts_ns) of its first token
    idle: Counter[int] = Counter()  # steps since its first token that made no token
    preempted_at: dict[int, int] = {}
    target: dict[int, int] = {}  # tokens its latest admission had to compute up to
    for step, ts_ns, kind, rid, payload in rows:
        values = json.loads(payload or "{}")
        if kind == PrefixLookup.kind:
            target[rid] = values["queried_tokens"]
        elif kind == FirstToken.kind:
            first[rid] = (step, ts_ns)
        elif kind == RequestPreempted.kind:
            preempted_at[rid] = step
        elif kind == RequestResumed.kind:
            since = preempted_at.pop(rid, step)
            if rid in first:
                idle[rid] += step - max(since, first[rid][0] + 1)
        elif kind == ChunkScheduled.kind and rid in first:
            # A recompute chunk that stops short of the sequence samples nothing.
            idle[rid] += values["start"] + values["tokens"] < target.get(rid, 0)
    progress = {}
    for rid, (first_step, first_ns) in first.items():
        if rid in preempted_at:  # still preempted: no token since
            idle[rid] += at.step + 1 - max(preempted_at[rid], first_step + 1)
        tokens = 1 + at.step - first_step - idle[rid]
        tpot = (at.ts_ns - first_ns) / 1e9 / (tokens - 1) if tokens > 1 else None
        progress[rid] = RequestProgress(tokens, tpot)
    return progress


_PROGRESS_KINDS = (
    PrefixLookup.kind,
    FirstToken.kind,
    RequestPreempted.kind,
    RequestResumed.kind,
    ChunkScheduled.kind,
)


def _status(rejected: str | None, finished: int | None, scheduled: int | None) -> str:
    if rejected is not None:
        return "rejected"
    if finished is not None:
        return "finished"
    return "running" if scheduled is not None else "waiting"


def requests_table(source: Source, run_id: int, *, latest: bool = True) -> list[RequestRow]:
    """One row per request, by request id, as it stands at the newest recorded step
    (without ``latest``, the figures read at that step are None: a running request's
    output tokens and TPOT, its page split and its missed tokens; ``requests_at``
    reads them at its own position)."""
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        rows = conn.execute(
            """SELECT request_id, arrival_ns, scheduled_ns, finished_ns, ttft_s, tpot_s,
                      prompt_tokens, output_tokens, cached_tokens, preemptions,
                      finish_reason, rejected_reason
               FROM requests WHERE run_id = ? ORDER BY request_id""",
            (run_id,),
        ).fetchall()
        so_far: dict[int, RequestProgress] = {}
        newest = conn.execute(
            "SELECT step, ts_ns FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,)
        ).fetchone()
        misses = request_miss_reasons(conn, run_id) if latest else {}
        holdings = None
        if latest and newest:
            running = [row[0] for row in rows if _status(row[11], row[3], row[2]) == "running"]
            so_far = request_progress(conn, Position(run_id, *newest), running)
            # The split from the exact page states of the newest step (the TUI's figures).
            at = step_pages(conn, run_id, newest[0])
            holdings = _holdings(at) if at is not None else None

    def since(ts_ns: int | None, origin: int | None) -> float | None:
        return (ts_ns - origin) / 1e9 if ts_ns is not None and origin is not None else None

    table = []
    for row in rows:
        (rid, arrival, scheduled, finished, ttft, tpot, prompt, output, cached) = row[:9]
        (preempt, reason, rejected) = row[9:]
        if rid in so_far:
            output, tpot = so_far[rid].output_tokens, so_far[rid].tpot_s
        table.append(
            RequestRow(
                request_id=rid,
                status=_status(rejected, finished, scheduled),
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
                **_missed(misses.get(rid)),
                **_split(holdings, rid),
            )
        )
    return table


def _split(holdings: dict[int, tuple[int, int, int, int]] | None, rid: int) -> dict:
    """A request row's page-split fields (all None without page states)."""
    names = ("pages", "private_pages", "shared_pages", "would_free")
    values = (None,) * 4 if holdings is None else holdings.get(rid, (0, 0, 0, 0))
    return dict(zip(names, values, strict=True))


def _missed(counts: MissCounts | None) -> dict[str, int | None]:
    """A request row's missed-token fields (None for a request never admitted)."""
    names = ("cold", "capacity", "granularity", "last_token")
    return {f"missed_{n}": None if counts is None else getattr(counts, n) for n in names}


def _by(arrival_s: float | None, offset: float | None, t_s: float) -> bool:
    """Whether ``offset`` seconds after arrival had come by ``t_s``."""
    return offset is not None and (arrival_s or 0.0) + offset <= t_s


def _holdings(pages: StepPages | np.ndarray | None) -> dict[int, tuple[int, int, int, int]]:
    """Request id -> (pages held, private, shared, would free if it finished now)."""
    if isinstance(pages, StepPages):
        out = {}
        for rid in pages.request_pages:
            h = pages.request_holdings(rid)
            out[rid] = (h.held, h.private, h.shared, h.would_free)
        return out
    if pages is None or not pages.size:
        return {}
    # Owner codes alone (a recording without holders): every held page reads private.
    held = np.bincount(pages[pages >= 0])
    return {int(rid): (int(n), int(n), 0, int(n)) for rid, n in enumerate(held) if n}


def requests_at(
    conn: sqlite3.Connection, at: Position, t_s: float, owners: StepPages | np.ndarray | None
) -> list[RequestState]:
    """Requests that had arrived by ``t_s`` (the position's time), in the state they
    were in then; ``owners`` (the page states there, or owner codes) gives the pages
    each held, shared ones included."""
    changes = conn.execute(
        """SELECT request_id, kind FROM events WHERE run_id = ? AND kind IN (?, ?)
           AND ts_ns <= ? AND step <= ? ORDER BY step, ts_ns, id""",
        (at.run_id, RequestPreempted.kind, RequestResumed.kind, at.ts_ns, at.step),
    ).fetchall()
    last_change = dict(changes)
    preemptions = Counter(rid for rid, kind in changes if kind == RequestPreempted.kind)
    holdings = _holdings(owners)
    arrived = []
    for r in requests_table(conn, at.run_id, latest=False):  # its figures at ``at`` below
        if r.arrival_s is not None and r.arrival_s > t_s:
            continue
        if r.status == "rejected":
            state = "rejected"
        elif r.status == "finished" and _by(r.arrival_s, r.e2e_s, t_s):
            state = "finished"
        elif last_change.get(r.request_id) == RequestPreempted.kind:
            state = "preempted"
        elif _by(r.arrival_s, r.queue_s, t_s):
            state = "running"
        else:
            state = "waiting"
        arrived.append((r, state))
    progress = request_progress(
        conn, at, [r.request_id for r, state in arrived if state in ("running", "preempted")]
    )
    misses = request_miss_reasons(conn, at.run_id, at)
    states = []
    for r, state in arrived:
        so_far = progress.get(r.request_id)
        held, private, shared, would_free = holdings.get(r.request_id, (0, 0, 0, 0))
        if state == "finished":
            output, tpot = r.output_tokens, r.tpot_s
        else:
            output, tpot = (so_far.output_tokens, so_far.tpot_s) if so_far else (None, None)
        states.append(
            RequestState(
                request_id=r.request_id,
                state=state,
                prompt_tokens=r.prompt_tokens,
                output_tokens=output,
                cached_tokens=r.cached_tokens if state != "waiting" else None,
                pages=held,
                ttft_s=r.ttft_s if _by(r.arrival_s, r.ttft_s, t_s) else None,
                tpot_s=tpot,
                preemptions=preemptions[r.request_id],
                private_pages=private,
                shared_pages=shared,
                would_free=would_free,
                misses=misses.get(r.request_id),
            )
        )
    return states


# --- one request's trace ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """One request's pages and tokens over its life."""

    request_id: int
    pages_t_s: list[float]
    pages: list[int]  # pages held after each allocation or release
    tokens_t_s: list[float]
    tokens: list[int | None]  # tokens held at its lifecycle events (None: a gap in the line)
    marks: list[tuple[float, str]]  # (t_s, event kind) of its lifecycle events


_TRACE_KINDS = (
    RequestArrived.kind,
    RequestScheduled.kind,
    ChunkScheduled.kind,
    FirstToken.kind,
    PagesAllocated.kind,
    PagesFreed.kind,
    RequestPreempted.kind,
    RequestResumed.kind,
    RequestFinished.kind,
)
_MARK_KINDS = frozenset(_TRACE_KINDS) - {ChunkScheduled.kind, PagesAllocated.kind, PagesFreed.kind}


def request_trace(source: Source, run_id: int, request_id: int) -> RequestTrace:
    """Read from the request's own events, looked up by kind within its lifetime
    so the (run, kind, time) index serves it on a run of any size."""
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        # Its lifetime ends with the step summary of the step it finished in: pages
        # it releases on finishing may be stamped after its RequestFinished.
        life = conn.execute(
            """SELECT arrival_ns, (SELECT MIN(s.ts_ns) FROM steps s
                                   WHERE s.run_id = r.run_id AND s.ts_ns >= r.finished_ns)
               FROM requests r WHERE run_id = ? AND request_id = ?""",
            (run_id, request_id),
        ).fetchone()
        if life is None:
            raise KvscopeError(f"no request {request_id} in run {run_id}")
        lo = life[0] if life[0] is not None else NO_START
        hi = life[1] if life[1] is not None else NO_END
        rows = conn.execute(
            f"""SELECT ts_ns, kind, payload FROM events
                WHERE run_id = ? AND kind IN ({kinds_sql(_TRACE_KINDS)})
                AND ts_ns BETWEEN ? AND ? AND request_id = ? ORDER BY ts_ns, id""",
            (run_id, lo, hi, request_id),
        ).fetchall()
    held = prompt = 0
    trace = RequestTrace(request_id, [], [], [], [], [])
    for ts_ns, kind, payload in rows:
        t_s = (ts_ns - start_ns) / 1e9
        values = json.loads(payload or "{}")
        if kind in (PagesAllocated.kind, PagesFreed.kind):
            held += len(values["pages"]) * (1 if kind == PagesAllocated.kind else -1)
            trace.pages_t_s.append(t_s)
            trace.pages.append(held)
        last = next((n for n in reversed(trace.tokens) if n is not None), 0)
        for tokens in _tokens_after(kind, values, prompt, last):
            trace.tokens_t_s.append(t_s)
            trace.tokens.append(tokens)
        prompt = values.get("prompt_tokens", prompt)
        if kind in _MARK_KINDS:
            trace.marks.append((t_s, kind))
    return trace


def _tokens_after(
    kind: str, values: dict[str, Any], prompt: int, last: int = 0
) -> tuple[int | None, ...]:
    """Points of the tokens line right after one of the request's events; None
    breaks the line where the count in between is not recorded (decoding up to
    a preemption, the recompute after it). Scheduling and prefill chunks are
    steps (the count before, then after, at one time): a waiting request holds
    nothing until it is scheduled, then its prefix hit at once."""
    if kind == RequestArrived.kind:
        return (0,)
    if kind == RequestScheduled.kind:
        return (last, values["cached_tokens"])
    if kind == ChunkScheduled.kind:
        return (last, values["start"] + values["tokens"])
    if kind == FirstToken.kind:
        return (prompt + 1,)
    if kind == RequestPreempted.kind:
        return (None, 0, None)
    if kind == RequestFinished.kind:
        return (values["prompt_tokens"] + values["output_tokens"],)
    return ()


@dataclass(frozen=True, slots=True)
class RequestTimes:
    """A request's lifecycle in nanoseconds since the run's start (None: not yet)."""

    request_id: int
    arrival_ns: int | None
    scheduled_ns: int | None
    first_token_ns: int | None
    finished_ns: int | None
    rejected: bool


def request_times(source: Source, run_id: int) -> list[RequestTimes]:
    """Exact integer times, so spans built from them nest without rounding."""
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        rows = conn.execute(
            """SELECT request_id, arrival_ns - ?1, scheduled_ns - ?1, first_token_ns - ?1,
                      finished_ns - ?1, rejected_reason IS NOT NULL
               FROM requests WHERE run_id = ?2 ORDER BY request_id""",
            (start_ns, run_id),
        ).fetchall()
    return [RequestTimes(*row[:5], bool(row[5])) for row in rows]
