"""Gaps, restarts, disconnects, bad messages and failed scrapes; events this
kvscope did not know, kept raw."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscope.db.source import Source, connection, run_origin
from kvscope.db.watch_read.windows import Window, _ns


@dataclass(frozen=True, slots=True)
class Incident:
    t_s: float
    source: int
    kind: str
    first_seq: int | None
    last_seq: int | None
    recovered: int
    lost: int
    detail: str | None


def incidents(
    source: Source, run_id: int, *, newest: int | None = None, window: Window | None = None
) -> list[Incident]:
    """Gaps, restarts, disconnects, bad messages and failed scrapes (of ``window``),
    in time order (only the ``newest`` ones when given: a flapping source makes
    thousands)."""
    limit = -1 if newest is None else int(newest)
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        rows = conn.execute(
            "SELECT * FROM (SELECT ts_ns, source, kind, first_seq, last_seq, recovered, lost, "
            "detail, rowid AS r FROM watch_incidents WHERE run_id = ? AND ts_ns BETWEEN ? AND ? "
            "ORDER BY ts_ns DESC, rowid DESC LIMIT ?) ORDER BY ts_ns, r",
            (run_id, *_ns(origin, window), limit),
        ).fetchall()
    return [Incident((row[0] - origin) / 1e9, *row[1:8]) for row in rows]


def raw_events(source: Source, run_id: int, limit: int = 1000) -> list[dict[str, Any]]:
    """Events or fields this kvscope did not know, as recorded."""
    with connection(source) as conn:
        rows = conn.execute(
            "SELECT source, seq, type, payload FROM watch_raw WHERE run_id = ? "
            "ORDER BY rowid LIMIT ?",
            (run_id, limit),
        ).fetchall()
    return [{"source": s, "seq": q, "type": t, "payload": p} for s, q, t, p in rows]


def seq_range(first: int | None, last: int | None) -> str:
    """An incident's sequence numbers as a label: ``5-9``, ``5`` for one, ``after 5`` for an
    open end (a resume continues after its last recorded batch: it had read "5-None")."""
    if first is None:
        return ""
    if last is None:
        return f"after {first}"
    return str(first) if last == first else f"{first}-{last}"
