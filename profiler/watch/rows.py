"""Decoded batches as ``watch_blocks`` and ``watch_raw`` rows.

One row per event, its hashes a JSON array (a list of ints' repr, but for
the spaces: several times faster than json.dumps): a BlockStored of n blocks chains
them, so block i's parent is block i-1 and the first one's is the event's
``parent_block_hash``. Token ids are not kept: a block's identity is its hash,
its size is the source's block size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from db.watch_schema import OP_CLEARED, OP_REMOVED, OP_STORED
from profiler.watch.wire import (
    ALL_BLOCKS_CLEARED,
    BLOCK_REMOVED,
    BLOCK_STORED,
    KNOWN_FIELDS,
    EventBatch,
)

# Distinct session ids and cache salts remembered per source (then counted as "at least").
MAX_DISTINCT = 10_000
EXAMPLES = 5


@dataclass(slots=True)
class SourceAttrs:
    """What a source told us about itself along the way: the newer per-event fields
    (vLLM group_idx and kv_cache_spec_kind, lora_name, extra_keys, locality,
    ownership, session_id; SGLang cache_salt, session_id) as summaries."""

    block_size: int | None = None
    spec_kinds: set[str] = field(default_factory=set)
    lora_names: set[str] = field(default_factory=set)
    media: set[str] = field(default_factory=set)
    groups: dict[int, str | None] = field(default_factory=dict)  # group_idx -> spec kind
    sessions: set[str] = field(default_factory=set)
    cache_salts: set[str] = field(default_factory=set)
    localities: set[str] = field(default_factory=set)
    ownerships: set[str] = field(default_factory=set)
    extra_keys_events: int = 0  # BlockStored events whose blocks carried extra keys
    block_events: int = 0

    def note(self, extra: dict[str, Any]) -> None:
        for name, kept in (("session_id", self.sessions), ("cache_salt", self.cache_salts)):
            value = extra.get(name)
            if value is not None and len(kept) < MAX_DISTINCT:
                kept.add(str(value))
        if extra.get("locality") is not None:
            self.localities.add(str(extra["locality"]))
        if extra.get("ownership") is not None:
            self.ownerships.add(str(extra["ownership"]))
        if extra.get("extra_keys") is not None:
            self.extra_keys_events += 1

    def as_json(self) -> str:
        def distinct(values: set[str]) -> dict[str, Any]:
            return {
                "count": len(values),
                "at_least": len(values) >= MAX_DISTINCT,
                "examples": sorted(values)[:EXAMPLES],
            }

        return json.dumps(
            {
                "kv_cache_spec_kinds": sorted(self.spec_kinds),
                "lora_names": sorted(self.lora_names),
                "media": sorted(self.media),
                "groups": {str(g): kind for g, kind in sorted(self.groups.items())},
                "session_ids": distinct(self.sessions),
                "cache_salts": distinct(self.cache_salts),
                "localities": sorted(self.localities),
                "ownerships": sorted(self.ownerships),
                "extra_keys_events": self.extra_keys_events,
            }
        )


def _json_default(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else repr(value)


def batch_rows(
    source: int,
    seq: int,
    ts_ns: int,
    batch: EventBatch,
    attrs: SourceAttrs,
    blocks: list[tuple],
    raw: list[tuple],
    hash_lists: list[list[int] | None],
) -> None:
    """Append ``batch``'s rows to ``blocks`` and ``raw``, each block row's hashes to
    ``hash_lists`` (for the aggregates); note its attributes in ``attrs``."""
    # Runs once per event at fleet rates: locals, no helper calls, no tuple unpacking.
    add = blocks.append
    keep = hash_lists.append
    block_events = 0
    for event in batch.events:
        kind = event.type
        if event.unknown or kind not in KNOWN_FIELDS:
            payload = json.dumps(event.unknown, default=_json_default)
            raw.append((source, seq, ts_ns, kind, payload))
        if kind == BLOCK_STORED:
            hashes = event.block_hashes
            medium = event.medium
            add((source, seq, ts_ns, OP_STORED, repr(hashes).replace(" ", ""),
                 event.parent_block_hash, medium, event.group_idx, len(hashes)))  # fmt: skip
            keep(hashes)
            block_events += len(hashes)
            if event.block_size is not None:
                attrs.block_size = event.block_size
            if medium is not None:
                attrs.media.add(medium)
            if event.spec_kind is not None:
                attrs.spec_kinds.add(event.spec_kind)
            if event.group_idx is not None and event.group_idx not in attrs.groups:
                attrs.groups[event.group_idx] = event.spec_kind
            if event.extra:
                attrs.note(event.extra)
            if event.lora_name is not None:
                attrs.lora_names.add(event.lora_name)
        elif kind == BLOCK_REMOVED:
            hashes = event.block_hashes
            add((source, seq, ts_ns, OP_REMOVED, repr(hashes).replace(" ", ""), None,
                 event.medium, event.group_idx, len(hashes)))  # fmt: skip
            if event.extra:
                attrs.note(event.extra)
            keep(hashes)
            block_events += len(hashes)
        elif kind == ALL_BLOCKS_CLEARED:
            add((source, seq, ts_ns, OP_CLEARED, None, None, None, None, 0))
            keep(None)
    attrs.block_events += block_events
