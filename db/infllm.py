"""Reads of InfLLM retrieval events: which distant blocks each step attended, and resident bytes.

The engine records one ``InfLLMRetrieval`` event per request per step in the
generic events table (no table of its own: its rows are few, one per decoding
request per step, and its payload is read only by these views).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvscope.db.source import Source, connection
from kvscope.engine.events import InfLLMRetrieval


@dataclass(frozen=True, slots=True)
class Retrieval:
    step: int
    request_id: int
    blocks_total: int
    chosen: dict[int, int]  # block -> layers that attended it this step
    blocks_reloaded: int
    cache_hits: int
    resident_bytes: int
    offloaded_bytes: int


def has_retrievals(source: Source, run_id: int) -> bool:
    """Whether the run recorded any retrieval (an infllm run with distant blocks)."""
    with connection(source) as conn:
        row = conn.execute(
            "SELECT 1 FROM events WHERE run_id = ? AND kind = ? LIMIT 1",
            (run_id, InfLLMRetrieval.kind),
        ).fetchone()
    return row is not None


def retrievals(
    source: Source,
    run_id: int,
    request_id: int | None = None,
    window_ns: tuple[int, int] | None = None,
) -> list[Retrieval]:
    """A run's retrieval events in step order (one request's, when given; those
    stamped within ``window_ns``, monotonic ns, when given: what the TUI shows)."""
    sql = "SELECT step, request_id, payload FROM events WHERE run_id = ? AND kind = ?"
    params: list = [run_id, InfLLMRetrieval.kind]
    if request_id is not None:
        sql += " AND request_id = ?"
        params.append(request_id)
    if window_ns is not None:
        sql += " AND ts_ns BETWEEN ? AND ?"
        params += window_ns
    with connection(source) as conn:
        rows = conn.execute(sql + " ORDER BY step, ts_ns", params).fetchall()
    out = []
    for step, rid, payload in rows:
        p = json.loads(payload)
        out.append(
            Retrieval(
                step,
                rid,
                p["blocks_total"],
                dict(zip(p["chosen_blocks"], p["chosen_layers"], strict=True)),
                p["blocks_reloaded"],
                p["cache_hits"],
                p["resident_bytes"],
                p["offloaded_bytes"],
            )
        )
    return out
