"""Reads of InfLLM retrieval events: which distant blocks each step attended, and resident bytes.

The engine records one ``InfLLMRetrieval`` event per request per step in the
generic events table (no table of its own: its rows are few, one per decoding
request per step, and its payload is read only by these views).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from db.source import Source, connection
from engine.events import InfLLMRetrieval


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


def retrievals(source: Source, run_id: int, request_id: int | None = None) -> list[Retrieval]:
    """A run's retrieval events in step order (one request's, when given)."""
    sql = "SELECT step, request_id, payload FROM events WHERE run_id = ? AND kind = ?"
    params: list = [run_id, InfLLMRetrieval.kind]
    if request_id is not None:
        sql += " AND request_id = ?"
        params.append(request_id)
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
