"""Reads of why prompt tokens missed the prefix cache: per request and for a whole run.

The engine records one ``prefix_miss`` event per request, at its first admission
(engine/miss_reasons.py explains the four reasons); a request admitted again after a
preemption records none, as its re-lookup is left out of the hit rate (vLLM's rule).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from kvscope.db.source import NO_END, Position, Source, connection
from kvscope.engine.events import PrefixMiss

# The reasons in display order, as (field of MissCounts, label).
REASONS = (
    ("cold", "cold"),
    ("capacity", "capacity"),
    ("granularity", "granularity"),
    ("last_token", "last token"),
)


@dataclass(frozen=True, slots=True)
class MissCounts:
    """Missed tokens by reason; ``capacity_age_s`` is the mean time since a capacity
    page was evicted (None with no capacity miss)."""

    cold: int
    capacity: int
    granularity: int
    last_token: int
    capacity_pages: int
    capacity_age_s: float | None
    capacity_age_steps: float | None

    @property
    def missed(self) -> int:
        return self.cold + self.capacity + self.granularity + self.last_token

    @property
    def main(self) -> str | None:
        """The label of the reason most missed tokens have (None with nothing missed)."""
        if not self.missed:
            return None
        return max(REASONS, key=lambda reason: getattr(self, reason[0]))[1]

    def shares(self) -> dict[str, float]:
        """Each reason's share of the missed tokens (0 with nothing missed)."""
        total = self.missed
        return {name: (getattr(self, name) / total if total else 0.0) for name, _ in REASONS}


_SUMS = """SUM(json_extract(payload, '$.cold_tokens')),
           SUM(json_extract(payload, '$.capacity_tokens')),
           SUM(json_extract(payload, '$.granularity_tokens')),
           SUM(json_extract(payload, '$.last_tokens')),
           SUM(json_extract(payload, '$.capacity_pages')),
           SUM(json_extract(payload, '$.capacity_age_s')),
           SUM(json_extract(payload, '$.capacity_age_steps'))"""


def _counts(row: tuple) -> MissCounts:
    cold, capacity, granularity, last, pages, age_s, age_steps = (v or 0 for v in row)
    return MissCounts(
        int(cold),
        int(capacity),
        int(granularity),
        int(last),
        int(pages),
        age_s / pages if pages else None,
        age_steps / pages if pages else None,
    )


def _query(
    conn: sqlite3.Connection, run_id: int, at: Position | None = None, by_request: bool = False
) -> list[tuple]:
    until = (NO_END, NO_END) if at is None else (at.step, at.ts_ns)
    return conn.execute(
        f"SELECT {_SUMS}{', request_id' if by_request else ''} FROM events "
        "WHERE run_id = ? AND kind = ? AND step <= ? AND ts_ns <= ?"
        f"{' GROUP BY request_id' if by_request else ''}",
        (run_id, PrefixMiss.kind, *until),
    ).fetchall()


def run_miss_reasons(source: Source, run_id: int) -> MissCounts | None:
    """The run's missed tokens by reason; None for a run that recorded none (an older
    recording, or one without the prefix cache)."""
    with connection(source) as conn:
        [row] = _query(conn, run_id)
    return None if row[0] is None else _counts(row)


def request_miss_reasons(
    source: Source, run_id: int, at: Position | None = None
) -> dict[int, MissCounts]:
    """Each request's missed tokens by reason, from its first admission (if it is at or
    before the position ``at``, when given)."""
    with connection(source) as conn:
        rows = _query(conn, run_id, at, by_request=True)
    return {row[-1]: _counts(row[:-1]) for row in rows}


def miss_line(counts: MissCounts | dict[str, Any] | None) -> str:
    """The split in one line of text, for summaries: 'cold 52% · capacity 30% ...'
    (``counts`` also as the dict a JSON summary carries)."""
    if isinstance(counts, dict):
        counts = MissCounts(**counts)
    if counts is None or not counts.missed:
        return "no missed tokens recorded"
    shares = counts.shares()
    parts = [f"{label} {shares[name]:.0%}" for name, label in REASONS]
    line = f"{counts.missed:,} missed tokens: " + " · ".join(parts)
    if counts.capacity_age_s is not None:
        line += f" (capacity pages evicted {counts.capacity_age_s:.3g} s before use on average)"
    return line


__all__ = ["REASONS", "MissCounts", "miss_line", "request_miss_reasons", "run_miss_reasons"]
