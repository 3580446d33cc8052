"""Reads of the per-step tables as time series: step summaries and GPU samples.

``step_series`` and ``gpu_series`` cut a window into equal time buckets
(``db.source.bucket_sql``) so a figure costs the same on a run of any length;
``step_times`` and ``step_row`` give a replay its positions and the step
summary at one of them; ``cached_sources`` splits cached tokens by tier.
"""

from __future__ import annotations

import bisect
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, fields, make_dataclass

import numpy as np

from kvscope.db import formulas
from kvscope.db.events import prefix_tokens
from kvscope.db.runs import page_size
from kvscope.db.schema import STEP_COLUMNS
from kvscope.db.source import Source, bucket_sql, connection, run_origin, window
from kvscope.engine.events import PageEvicted, PageReloaded, RequestPreempted, StepSummary


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
class GpuPoint:
    """One time bucket of GPU samples of one device (means over the bucket)."""

    t_s: float
    gpu_index: int
    utilization_pct: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    torch_allocated_bytes: float | None


# One step summary as recorded, with ``t_s`` in place of ``ts_ns``: its fields
# are engine.events.StepSummary's, as are db.schema.STEP_COLUMNS.
StepRow = make_dataclass(
    "StepRow",
    [("t_s", float), ("step", int), *((f.name, f.type) for f in fields(StepSummary)[2:])],
    frozen=True,
    slots=True,
)
StepRow.__module__ = __name__
StepRow.__doc__ = "One step summary as recorded, at ``t_s`` seconds since the run's start."


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Every recorded step of a run and its time, ascending: a replay's positions."""

    steps: tuple[int, ...] = ()
    t_s: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def end_s(self) -> float:
        return self.t_s[-1] if self.t_s else 0.0

    def index_at(self, t_s: float) -> int:
        """Index of the last step recorded at or before ``t_s`` (0 before the first)."""
        return max(0, bisect.bisect_right(self.t_s, t_s) - 1)

    def index_of_step(self, step: int) -> int:
        """Index of ``step``, or of the last recorded step before it (0 before the first)."""
        return max(0, bisect.bisect_right(self.steps, step) - 1)


def step_times(source: Source, run_id: int, known: StepTimes = StepTimes()) -> StepTimes:
    """The run's steps so far: ``known`` extended by the steps recorded after its last."""
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        rows = conn.execute(
            "SELECT step, ts_ns FROM steps WHERE run_id = ? AND step > ? ORDER BY step",
            (run_id, known.steps[-1] if known.steps else -1),
        ).fetchall()
    if not rows:
        return known
    return StepTimes(
        known.steps + tuple(step for step, _ in rows),
        known.t_s + tuple((ts - start_ns) / 1e9 for _, ts in rows),
    )


def step_row(conn: sqlite3.Connection, run_id: int, step: int) -> StepRow | None:
    """The step summary of ``step`` as recorded, None if there is none."""
    row = conn.execute(
        f"""SELECT (s.ts_ns - r.start_ns) / 1e9, s.step, {", ".join(STEP_COLUMNS[2:])}
            FROM steps s JOIN runs r ON r.id = s.run_id WHERE s.run_id = ? AND s.step = ?""",
        (run_id, step),
    ).fetchone()
    return None if row is None else StepRow(*row)


assert [f.name for f in fields(StepRow)] == ["t_s", "step", *STEP_COLUMNS[2:]]


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
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        lo, hi = window(start_ns, since_s, until_s)
        lo, hi = conn.execute(
            "SELECT MIN(ts_ns), MAX(ts_ns) FROM steps WHERE run_id = ? AND ts_ns BETWEEN ? AND ?",
            (run_id, lo, hi),
        ).fetchone()
        if lo is None:
            return []
        bucket = bucket_sql(lo, hi, max_points)
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
        lookups = prefix_tokens(conn, run_id, lo, hi, bucket=bucket)
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
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        lo, hi = window(start_ns, since_s, until_s)
        lo, hi = conn.execute(
            "SELECT MIN(ts_ns), MAX(ts_ns) FROM gpu_samples WHERE run_id = ? AND ts_ns BETWEEN ? AND ?",
            (run_id, lo, hi),
        ).fetchone()
        if lo is None:
            return []
        rows = conn.execute(
            f"""SELECT {bucket_sql(lo, hi, max_points)} AS b,
                       gpu_index, MAX(ts_ns), AVG(utilization_pct), AVG(memory_used_bytes),
                       AVG(memory_total_bytes), AVG(power_w), AVG(sm_clock_mhz),
                       AVG(torch_allocated_bytes)
                FROM gpu_samples WHERE run_id = ? AND ts_ns BETWEEN ? AND ?
                GROUP BY b, gpu_index ORDER BY b, gpu_index""",
            (run_id, lo, hi),
        ).fetchall()
    return [GpuPoint((row[2] - start_ns) / 1e9, row[1], *row[3:]) for row in rows]


@dataclass(frozen=True, slots=True)
class CachedSources:
    """Tokens served from cache per step-series bucket, by where they were held."""

    t_s: list[float]
    device_tokens: list[int]  # prefix-cache hits on device pages
    host_tokens: list[int]  # tokens of pages reloaded from the host tier


def cached_sources(source: Source, run_id: int, points: Sequence[StepPoint]) -> CachedSources:
    """Split ``points``' cached tokens by tier. A bucket of the step series ends at
    its ``t_s``; a reload belongs to the first bucket ending at or after it."""
    ends = np.array([p.t_s for p in points], dtype=np.float64)
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        reloads = np.array(
            [
                ts
                for (ts,) in conn.execute(
                    "SELECT ts_ns FROM events WHERE run_id = ? AND kind = ?",
                    (run_id, PageReloaded.kind),
                )
            ],
            dtype=np.int64,
        )
        tokens_per_page = page_size(conn, run_id) or 0
    buckets = np.searchsorted(ends, (reloads - start_ns) / 1e9, side="left")
    per_bucket = np.bincount(buckets[buckets < len(ends)], minlength=len(ends))
    return CachedSources(
        t_s=ends.tolist(),
        device_tokens=[p.prefix_hit_tokens for p in points],
        host_tokens=(per_bucket * tokens_per_page).tolist(),
    )


def busiest_step(source: Source, run_id: int) -> int | None:
    """The step worth a picture: once the cache is under pressure (something was
    evicted or preempted), the one with the most requests running on the most
    pages; None without steps."""
    with connection(source) as conn:
        row = conn.execute(
            """SELECT step FROM steps WHERE run_id = :run AND step >= COALESCE(
                 (SELECT MIN(step) FROM events WHERE run_id = :run AND kind IN (:evicted, :preempted)),
                 0)
               ORDER BY running * pages_used DESC, step LIMIT 1""",
            {"run": run_id, "evicted": PageEvicted.kind, "preempted": RequestPreempted.kind},
        ).fetchone()
    return None if row is None else row[0]
