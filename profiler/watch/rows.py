"""Decoded batches as ``watch_blocks`` and ``watch_raw`` rows.

A row per BlockStored, its hashes a JSON array: a BlockStored of n blocks chains
them, so block i's parent is block i-1 and the first one's is the event's
``parent_block_hash``. Token ids are not kept: a block's identity is its hash,
its size is the source's block size.

A batch's BlockRemoved events of one medium and group_idx, with no field beyond
those, share a row (their hashes in order, ``blocks`` their count): vLLM removes
a block an event, interleaved with the stores of the same step, and a row costs
the writer an insert and a fold call. The shared row goes where the run of
removals ends: before the first event that is not a plain BlockStored of the
same shelf and other hashes (a clear, another medium or group, a store of one of
its hashes), or at the end of the batch. So a hash's own events keep their
order; the fold counts a removal per hash (a hash twice is two copies removed)
and notes its figures (the fleet's peak extra copies too) once per run of rows
of a batch, which is why its aggregates are those of a row per event
(tests/watch/test_watch_rows.py).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from db.watch_schema import OP_CLEARED, OP_REMOVED, OP_STORED
from profiler.watch.wire import (
    _MAX_INT64,
    _TWO_64,
    ALL_BLOCKS_CLEARED,
    BLOCK_REMOVED,
    BLOCK_STORED,
    KNOWN_FIELDS,
    EventBatch,
    RemovedEvent,
    StoredEvent,
    removed_extra,
    stored_extra,
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


def _repr_json(hashes: list) -> str:
    """The general path's hashes as JSON text: a list's repr but for the spaces (its
    values may be other than 64-bit ints, and are stored as they came)."""
    return repr(hashes).replace(" ", "")


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
    if batch.known:
        _known_rows(source, seq, ts_ns, batch.events, attrs, blocks, hash_lists)
        return
    # The general path (unknown fields, positional events, SGLang's 2-element batch):
    # the same rows as _known_rows, from KvEvents.
    add = blocks.append
    keep = hash_lists.append
    block_events = 0
    run: list[int] | None = None  # plain removals sharing a row, not yet added
    run_set: set = set()  # their hashes
    run_medium = run_group = None
    for event in batch.events:
        kind = event.type
        if kind == BLOCK_REMOVED and not event.unknown and not event.extra:
            hashes, medium, group = event.block_hashes, event.medium, event.group_idx
            if run is not None:
                if medium == run_medium and group == run_group:
                    run += hashes
                    run_set.update(hashes)
                    continue
                add((source, seq, ts_ns, OP_REMOVED, _repr_json(run), None, run_medium,
                     run_group, len(run)))  # fmt: skip
                keep(run)
                block_events += len(run)
            run, run_set, run_medium, run_group = list(hashes), set(hashes), medium, group
            continue
        if run is not None and (
            kind != BLOCK_STORED or event.unknown or event.medium != run_medium
            or (event.group_idx or 0) != (run_group or 0)  # the fold's shelf: None is 0
            or not run_set.isdisjoint(event.block_hashes)
        ):  # fmt: skip
            add((source, seq, ts_ns, OP_REMOVED, _repr_json(run), None, run_medium, run_group,
                 len(run)))  # fmt: skip
            keep(run)
            block_events += len(run)
            run = None
        if event.unknown or kind not in KNOWN_FIELDS:
            payload = json.dumps(event.unknown, default=_json_default)
            raw.append((source, seq, ts_ns, kind, payload))
        if kind == BLOCK_STORED:
            hashes = event.block_hashes
            medium = event.medium
            add((source, seq, ts_ns, OP_STORED, _repr_json(hashes), event.parent_block_hash,
                 medium, event.group_idx, len(hashes)))  # fmt: skip
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
        elif kind == BLOCK_REMOVED:  # with unknown or extra fields: a row of its own
            hashes = event.block_hashes
            add((source, seq, ts_ns, OP_REMOVED, _repr_json(hashes), None, event.medium,
                 event.group_idx, len(hashes)))  # fmt: skip
            if event.extra:
                attrs.note(event.extra)
            keep(hashes)
            block_events += len(hashes)
        elif kind == ALL_BLOCKS_CLEARED:
            add((source, seq, ts_ns, OP_CLEARED, None, None, None, None, 0))
            keep(None)
    if run is not None:
        add((source, seq, ts_ns, OP_REMOVED, _repr_json(run), None, run_medium, run_group,
             len(run)))  # fmt: skip
        keep(run)
        block_events += len(run)
    attrs.block_events += block_events


def _pack(hashes: Sequence[int]) -> tuple[str, bytes]:
    """A typed event's hashes as handed to the writer: their JSON text (signed, as
    SQLite keeps them) for the row, and for the aggregates native 64-bit ints, which
    the writer reads back signed as a list (``db.watch_writer.unpack_hashes``): a
    fraction of marshal's bytes and time for a list of ints (a 2,000-batch
    prefill-like chunk was 7 MB), the writer process being the one that waits. vLLM
    sends them unsigned, SGLang signed (msgpack holds nothing wider)."""
    try:
        packed = array("Q", hashes).tobytes()
    except OverflowError:  # a negative hash: signed as it came
        packed = array("q", [v - _TWO_64 if v > _MAX_INT64 else v for v in hashes]).tobytes()
    signed = array("q")
    signed.frombytes(packed)
    return _encode(signed.tolist()).decode(), packed


_encode = msgspec.json.encode  # the same text as the general path's repr for 64-bit ints


def _known_rows(
    source: int,
    seq: int,
    ts_ns: int,
    events: Sequence[Any],
    attrs: SourceAttrs,
    blocks: list[tuple],
    hash_lists: list[list[int] | None],
) -> None:
    """``batch_rows`` of the usual batch: its typed structs (``EventBatch.known``),
    straight to rows with one pass per event, their hashes packed for the aggregates
    (``_pack``). The same rows and attributes as the general path makes from the same
    events as ``KvEvent``, and once the writer unpacked them the same hash lists
    (tests/watch check it)."""
    add = blocks.append
    keep = hash_lists.append
    media, spec_kinds, groups = attrs.media, attrs.spec_kinds, attrs.groups
    block_events = 0
    run: list[int] | None = None  # plain removals' hashes (as sent) sharing a row, not yet added
    run_set: set = set()  # their hashes
    run_medium = run_group = None
    for e in events:
        cls = type(e)
        if cls is RemovedEvent and e.locality is None and e.ownership is None:
            hashes = e.block_hashes
            medium, group = e.medium, e.group_idx
            if run is not None:
                if medium == run_medium and group == run_group:
                    run += hashes
                    run_set.update(hashes)
                    continue
                text, packed = _pack(run)
                add((source, seq, ts_ns, OP_REMOVED, text, None, run_medium, run_group,
                     len(run)))  # fmt: skip
                keep(packed)
                block_events += len(run)
            run, run_set, run_medium, run_group = list(hashes), set(hashes), medium, group
            continue
        if cls is StoredEvent:
            hashes = e.block_hashes
            p = e.parent_block_hash
            if p is not None and p > _MAX_INT64:
                p -= _TWO_64
            medium, group = e.medium, e.group_idx
            if run is not None and (
                medium != run_medium
                or (group or 0) != (run_group or 0)  # the fold's shelf: no group is group 0
                or not run_set.isdisjoint(hashes)
            ):
                # the removals go before a store of theirs (or of another shelf): in order
                text, packed = _pack(run)
                add((source, seq, ts_ns, OP_REMOVED, text, None, run_medium, run_group,
                     len(run)))  # fmt: skip
                keep(packed)
                block_events += len(run)
                run = None
            text, packed = _pack(hashes)
            add((source, seq, ts_ns, OP_STORED, text, p, medium, group, len(hashes)))
            keep(packed)
            block_events += len(hashes)
            if e.block_size is not None:
                attrs.block_size = e.block_size
            if medium is not None:
                media.add(medium)
            spec_kind = e.kv_cache_spec_kind
            if spec_kind is not None:
                spec_kinds.add(spec_kind)
            if group is not None and group not in groups:
                groups[group] = spec_kind
            if e.session_id is not None or e.cache_salt is not None or e.locality is not None \
                    or e.ownership is not None or e.extra_keys is not None:  # fmt: skip
                extra = stored_extra(e)
                if extra:
                    attrs.note(extra)
            if e.lora_name is not None:
                attrs.lora_names.add(e.lora_name)
        elif cls is RemovedEvent:  # with locality or ownership: a row of its own
            if run is not None:
                text, packed = _pack(run)
                add((source, seq, ts_ns, OP_REMOVED, text, None, run_medium, run_group,
                     len(run)))  # fmt: skip
                keep(packed)
                block_events += len(run)
                run = None
            hashes = e.block_hashes
            text, packed = _pack(hashes)
            add((source, seq, ts_ns, OP_REMOVED, text, None, e.medium, e.group_idx,
                 len(hashes)))  # fmt: skip
            attrs.note(removed_extra(e))
            keep(packed)
            block_events += len(hashes)
        else:
            if run is not None:
                text, packed = _pack(run)
                add((source, seq, ts_ns, OP_REMOVED, text, None, run_medium, run_group,
                     len(run)))  # fmt: skip
                keep(packed)
                block_events += len(run)
                run = None
            add((source, seq, ts_ns, OP_CLEARED, None, None, None, None, 0))
            keep(None)
    if run is not None:
        text, packed = _pack(run)
        add((source, seq, ts_ns, OP_REMOVED, text, None, run_medium, run_group,
             len(run)))  # fmt: skip
        keep(packed)
        block_events += len(run)
    attrs.block_events += block_events
