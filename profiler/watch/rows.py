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
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kvscope.db.watch_schema import OP_CLEARED, OP_REMOVED, OP_STORED
from kvscope.profiler.watch.wire import (
    _MAX_INT64,
    _TWO_64,
    ALL_BLOCKS_CLEARED,
    BLOCK_REMOVED,
    BLOCK_STORED,
    KNOWN_FIELDS,
    EventBatch,
    KvEvent,
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


def _as_text(hashes: list) -> tuple[str, list]:
    """The general path's row text and hash list (``_pack``'s counterpart)."""
    return _repr_json(hashes), hashes


class _Removals:
    """A batch's plain removals of one shelf sharing a row, not yet added: the row goes
    before the first event that may not pass them (see the module docstring)."""

    __slots__ = ("hashes", "seen", "medium", "group")

    def __init__(self, hashes: Sequence[int], medium: str | None, group: int | None) -> None:
        self.hashes = list(hashes)
        self.seen = set(hashes)
        self.medium, self.group = medium, group

    def take(self, hashes: Sequence[int], medium: str | None, group: int | None) -> bool:
        """Add the removal of ``hashes`` if it is of this shelf, as named."""
        if medium != self.medium or group != self.group:
            return False
        self.hashes += hashes
        self.seen.update(hashes)
        return True

    def pass_store(self, hashes: Sequence[int], medium: str | None, group: int | None) -> bool:
        """Whether a store of ``hashes`` may go before these removals: on the fold's same
        shelf (no group is group 0), of none of their hashes."""
        return (
            medium == self.medium
            and (group or 0) == (self.group or 0)
            and self.seen.isdisjoint(hashes)
        )

    def add_row(self, source: int, seq: int, ts_ns: int, pack: Any, add: Any, keep: Any) -> None:
        text, kept = pack(self.hashes)
        add((source, seq, ts_ns, OP_REMOVED, text, None, self.medium, self.group,
             len(self.hashes)))  # fmt: skip
        keep(kept)


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
    first = len(blocks)
    if batch.known:
        _known_rows(source, seq, ts_ns, batch.events, attrs, blocks, hash_lists)
    else:
        _general_rows(source, seq, ts_ns, batch.events, attrs, blocks, raw, hash_lists)
    attrs.block_events += sum(row[8] for row in blocks[first:])


def _general_rows(
    source: int,
    seq: int,
    ts_ns: int,
    events: Sequence[KvEvent],
    attrs: SourceAttrs,
    blocks: list[tuple],
    raw: list[tuple],
    hash_lists: list[list[int] | None],
) -> None:
    """``batch_rows`` of anything but the usual batch (unknown fields, positional
    events, SGLang's 2-element batch): the same rows as ``_known_rows``, from KvEvents."""
    add = blocks.append
    keep = hash_lists.append
    run: _Removals | None = None
    for event in events:
        kind = event.type
        if kind == BLOCK_REMOVED and not event.unknown and not event.extra:
            hashes, medium, group = event.block_hashes, event.medium, event.group_idx
            if run is not None:
                if run.take(hashes, medium, group):
                    continue
                run.add_row(source, seq, ts_ns, _as_text, add, keep)
            run = _Removals(hashes, medium, group)
            continue
        if run is not None and (
            kind != BLOCK_STORED or event.unknown
            or not run.pass_store(event.block_hashes, event.medium, event.group_idx)
        ):  # fmt: skip
            run.add_row(source, seq, ts_ns, _as_text, add, keep)
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
        elif kind == ALL_BLOCKS_CLEARED:
            add((source, seq, ts_ns, OP_CLEARED, None, None, None, None, 0))
            keep(None)
    if run is not None:
        run.add_row(source, seq, ts_ns, _as_text, add, keep)


def _pack(hashes: Sequence[int]) -> tuple[str, bytes]:
    """A typed event's hashes as handed to the writer: their JSON text (signed, as
    SQLite keeps them) for the row, and for the aggregates native 64-bit ints, which
    the writer reads back signed as a list (``db.watch_batch.unpack_hashes``): a
    fraction of marshal's bytes and time for a list of ints (a 2,000-batch
    prefill-like chunk was 7 MB), the writer process being the one that waits. vLLM
    sends them unsigned, SGLang signed (msgpack holds nothing wider). One hash (a
    decode step's block) without the arrays: a one-hash stream is an event a block."""
    if len(hashes) == 1:
        value = hashes[0]
        if value > _MAX_INT64:
            value -= _TWO_64
        try:
            return f"[{value}]", _pack_one(value)
        except struct.error:
            pass  # out of 64 bits: as below, which says so
    try:
        packed = array("Q", hashes).tobytes()
    except OverflowError:  # a negative hash: signed as it came
        packed = array("q", [v - _TWO_64 if v > _MAX_INT64 else v for v in hashes]).tobytes()
    signed = array("q")
    signed.frombytes(packed)
    return _encode(signed.tolist()).decode(), packed


_encode = msgspec.json.encode  # the same text as the general path's repr for 64-bit ints
_pack_one = struct.Struct("=q").pack  # native order, as array's tobytes


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
    run: _Removals | None = None  # of hashes as sent
    for e in events:
        cls = type(e)
        if cls is RemovedEvent and e.locality is None and e.ownership is None:
            if run is not None:
                if run.take(e.block_hashes, e.medium, e.group_idx):
                    continue
                run.add_row(source, seq, ts_ns, _pack, add, keep)
            run = _Removals(e.block_hashes, e.medium, e.group_idx)
            continue
        if run is not None and (
            cls is not StoredEvent or not run.pass_store(e.block_hashes, e.medium, e.group_idx)
        ):
            run.add_row(source, seq, ts_ns, _pack, add, keep)
            run = None
        if cls is StoredEvent:
            hashes = e.block_hashes
            p = e.parent_block_hash
            if p is not None and p > _MAX_INT64:
                p -= _TWO_64
            medium, group = e.medium, e.group_idx
            text, packed = _pack(hashes)
            add((source, seq, ts_ns, OP_STORED, text, p, medium, group, len(hashes)))
            keep(packed)
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
            hashes = e.block_hashes
            text, packed = _pack(hashes)
            add((source, seq, ts_ns, OP_REMOVED, text, None, e.medium, e.group_idx,
                 len(hashes)))  # fmt: skip
            attrs.note(removed_extra(e))
            keep(packed)
        else:
            add((source, seq, ts_ns, OP_CLEARED, None, None, None, None, 0))
            keep(None)
    if run is not None:
        run.add_row(source, seq, ts_ns, _pack, add, keep)
