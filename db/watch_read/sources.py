"""The watched sources: endpoints, engine kinds, counters and the fields they sent."""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvscope.db.source import Source, connection


@dataclass(frozen=True, slots=True)
class WatchSource:
    """One row of ``watch_sources``."""

    source: int
    kind: str
    engine: str
    endpoint: str
    replay: str | None
    topic: str | None
    dp_rank: int | None
    listen: bool
    block_size: int | None
    last_seq: int | None
    batches: int
    events: int
    block_events: int
    gaps: int
    recovered_batches: int
    lost_batches: int
    restarts: int
    disconnects: int
    bad_messages: int
    attrs: str | None

    @property
    def label(self) -> str:
        rank = "" if self.dp_rank is None else f" dp{self.dp_rank}"
        return f"{self.source}: {self.endpoint}{rank}"


def attrs_summary(attrs: str | None) -> str:
    """A source's newer per-event fields in a few words: hybrid groups and their
    spec kinds, LoRAs, session ids, cache salts, locality, ownership, extra keys."""
    try:
        a = json.loads(attrs or "{}")
    except ValueError:
        return ""
    parts = []
    groups = a.get("groups") or {}
    if len(groups) > 1 or any(kind not in (None, "full_attention") for kind in groups.values()):
        parts.append("groups " + " ".join(f"{g}:{kind or '?'}" for g, kind in groups.items()))
    if a.get("lora_names"):
        parts.append("LoRA " + ", ".join(a["lora_names"]))
    for key, name in (("session_ids", "sessions"), ("cache_salts", "cache salts")):
        seen = a.get(key) or {}
        if seen.get("count"):
            parts.append(f"{'>=' if seen.get('at_least') else ''}{seen['count']:,} {name}")
    for key in ("localities", "ownerships"):
        if a.get(key):
            parts.append(f"{key[:-3]}y " + ", ".join(a[key]))
    if a.get("extra_keys_events"):
        parts.append(f"extra keys on {a['extra_keys_events']:,} stores")
    return "; ".join(parts)


def watch_sources(source: Source, run_id: int) -> list[WatchSource]:
    names = ", ".join(f.name for f in WatchSource.__dataclass_fields__.values())
    with connection(source) as conn:
        rows = conn.execute(
            f"SELECT {names} FROM watch_sources WHERE run_id = ? ORDER BY source", (run_id,)
        ).fetchall()
    return [WatchSource(*row[:7], bool(row[7]), *row[8:]) for row in rows]
