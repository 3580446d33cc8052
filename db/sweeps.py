"""Reads of capacity sweeps: the replay runs of one ``kvscope replay`` grouped by sweep.

``kvscope replay --db`` records every (capacity, policy, page size) point as a run
of kind ``replay`` whose config carries ``sweep_id``; the unlimited-capacity point
(``capacity_tokens`` None) is the sweep's ceiling. A point's hit rate comes from
the summary stored when its run finished, or from its prefix lookups while it
runs; its missed tokens by reason from ``db.miss_reasons``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.db.events import prefix_tokens
from kvscope.db.formulas import hit_rate
from kvscope.db.miss_reasons import MissCounts, run_miss_reasons
from kvscope.db.source import Source, connection, stored_json

REPLAY = "replay"


@dataclass(frozen=True, slots=True)
class SweepPoint:
    run_id: int
    capacity_tokens: int | None  # None: unlimited (the ceiling)
    policy: str
    page_size: int
    hit_rate: float | None
    status: str
    misses: MissCounts | None = None


@dataclass(frozen=True, slots=True)
class Sweep:
    sweep_id: str
    trace: str
    started_at: float
    kv_dtype: str | None
    preset: str | None
    timing: str | None
    points: tuple[SweepPoint, ...]

    @property
    def label(self) -> str:
        return f"{self.trace} · {self.timing} · sweep {self.sweep_id}"

    def ceiling(self, page_size: int) -> float | None:
        """The unlimited-capacity hit rate at ``page_size`` (None if not recorded)."""
        for p in self.points:
            if p.capacity_tokens is None and p.page_size == page_size:
                return p.hit_rate
        return None


def _replay_runs(conn) -> list[tuple[int, dict, str, float]]:
    rows = conn.execute(
        "SELECT id, config, status, started_at FROM runs WHERE kind = ? ORDER BY id", (REPLAY,)
    ).fetchall()
    return [(rid, stored_json(config, rid, "config"), status, t) for rid, config, status, t in rows]


def list_sweeps(source: Source) -> list[Sweep]:
    """Every recorded sweep, newest first, with its points' hit rates (no miss split)."""
    return _sweeps(source, None, misses=False)


def sweep(source: Source, sweep_id: str, misses: bool = True) -> Sweep | None:
    """One sweep by id, with each point's missed tokens by reason (``misses``)."""
    found = _sweeps(source, sweep_id, misses)
    return found[0] if found else None


def _sweeps(source: Source, only: str | None, misses: bool) -> list[Sweep]:
    with connection(source) as conn:
        groups: dict[str, list[tuple[int, dict, str, float]]] = {}
        for run in _replay_runs(conn):
            sid = run[1].get("sweep_id")
            if sid is not None and (only is None or sid == only):
                groups.setdefault(str(sid), []).append(run)
        ids = [r[0] for runs in groups.values() for r in runs]
        stored = dict(
            conn.execute(
                f"SELECT run_id, value FROM metrics WHERE name = 'prefix_hit_rate' "
                f"AND run_id IN ({','.join('?' * len(ids))})",
                ids,
            ).fetchall()
        )
        out = []
        for sid, runs in groups.items():
            points = []
            for rid, config, status, _ in runs:
                rate = stored.get(rid)
                if rate is None:  # still running (or its summary had no lookups)
                    queried, hit = prefix_tokens(conn, rid).get(0, (0, 0))
                    rate = hit_rate(hit, queried)
                points.append(
                    SweepPoint(
                        run_id=rid,
                        capacity_tokens=config.get("capacity_tokens"),
                        policy=str(config.get("eviction_policy")),
                        page_size=int(config.get("page_size") or 0),
                        hit_rate=rate,
                        status=status,
                        misses=run_miss_reasons(conn, rid) if misses else None,
                    )
                )
            first = runs[0][1]
            out.append(
                Sweep(
                    sweep_id=sid,
                    trace=str(first.get("trace")),
                    started_at=runs[0][3],
                    kv_dtype=first.get("kv_dtype"),
                    preset=first.get("preset"),
                    timing=first.get("timing"),
                    points=tuple(points),
                )
            )
    return sorted(out, key=lambda s: -s.started_at)


__all__ = ["REPLAY", "Sweep", "SweepPoint", "list_sweeps", "sweep"]
