"""The KV-cache event wire format that vLLM and SGLang publish over ZMQ.

A live message is three frames: topic, an 8-byte big-endian sequence number
and a msgpack payload ``[ts, events, dp_rank?]``. Events are maps with a
``"type"`` key (vLLM >= 0.24, SGLang) or positional arrays with the type first
(vLLM <= 0.23, trailing defaults omitted). Decoding never fails on what it does
not know: unknown fields and event types are kept in ``KvEvent.unknown`` so the
recorder can store them raw. Hashes become signed 64-bit (vLLM sends unsigned,
SGLang signed), the only form SQLite can hold.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from kvscope.engine.errors import KvscopeError

BLOCK_STORED = "BlockStored"
BLOCK_REMOVED = "BlockRemoved"
ALL_BLOCKS_CLEARED = "AllBlocksCleared"

# Field order of the positional (array_like msgspec) events, after the tag.
POSITIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    BLOCK_STORED: (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    ),
    BLOCK_REMOVED: ("block_hashes", "medium", "group_idx"),
    ALL_BLOCKS_CLEARED: (),
}

# Every documented field (vLLM 0.33, SGLang 0.5.23). Those not stored in columns
# are summarised (see profiler.watch.rows) or, like token ids, deliberately not
# kept: a block's identity is its hash and its parent.
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    BLOCK_STORED: frozenset(
        POSITIONAL_FIELDS[BLOCK_STORED]
        + (
            "type",
            "locality",
            "ownership",
            "session_id",
            "lookahead_token_ids",
            "cache_salt",
        )
    ),
    BLOCK_REMOVED: frozenset(POSITIONAL_FIELDS[BLOCK_REMOVED] + ("type", "locality", "ownership")),
    ALL_BLOCKS_CLEARED: frozenset(("type",)),
}

# Kept per source as summaries (profiler.watch.rows.SourceAttrs).
EXTRA_FIELDS = ("session_id", "cache_salt", "locality", "ownership", "extra_keys")

_SEQ = struct.Struct(">Q")
_SIGNED_SEQ = struct.Struct(">q")
_TWO_64 = 1 << 64
_MAX_INT64 = (1 << 63) - 1
_MIN_INT64 = -(1 << 63)
# The replay stream ends with this sequence number (8 signed bytes).
REPLAY_END = -1


def to_signed64(value: int) -> int:
    """A 64-bit hash as SQLite can store it: unsigned values >= 2^63 wrap to negative."""
    return value - _TWO_64 if value > _MAX_INT64 else value


def to_unsigned64(value: int) -> int:
    """The inverse of ``to_signed64``: the hash as vLLM printed it."""
    return value + _TWO_64 if value < 0 else value


def pack_seq(seq: int) -> bytes:
    return _SEQ.pack(seq) if seq >= 0 else _SIGNED_SEQ.pack(seq)


def unpack_seq(frame: bytes) -> int:
    """An 8-byte big-endian sequence number; -1 (all ones) marks the end of a replay."""
    if len(frame) != 8:
        raise KvscopeError(f"sequence frame of {len(frame)} bytes, expected 8")
    return _SIGNED_SEQ.unpack(frame)[0]


class KvEvent(msgspec.Struct, gc=False):
    """One decoded event. ``unknown`` holds fields this decoder does not know
    (for an unknown event type: all of them); empty for the usual events.

    A struct the garbage collector does not track (it holds no cycles): a full
    queue holds hundreds of thousands of them, and tracking them made the
    collector's passes cost a quarter of the recording rate."""

    type: str
    block_hashes: list[int] = []  # signed 64-bit
    parent_block_hash: int | None = None
    block_size: int | None = None
    medium: str | None = None
    group_idx: int | None = None
    lora_name: str | None = None
    spec_kind: str | None = None
    unknown: dict[str, Any] = {}
    # The newer per-event fields when any is set (session_id, cache_salt, locality,
    # ownership, extra_keys): summarised per source, not stored per event.
    extra: dict[str, Any] = {}


class EventBatch(msgspec.Struct, gc=False):
    """One scheduler step's events, as published.

    ``known``: the events are a tuple of the usual batch's typed structs
    (``StoredEvent``, ``RemovedEvent``, ``ClearedEvent``: known fields only, hashes
    a tuple of unsigned ints as sent), not ``KvEvent``. The recorder makes rows from
    them in one pass per event (``profiler.watch.rows``): a ``KvEvent`` and a signed
    hash list made per event here, then read again there, had cost a third of the
    watching process's CPU. And a queued known batch holds nothing the garbage
    collector keeps tracking (this struct is untracked, as are tuples of ints and
    of untracked structs once a young collection has seen them): the lists a
    queue of 20,000 batches held had made the collector's passes cost the
    watching process a third of its CPU again. ``decode_payload`` always gives
    ``KvEvent``."""

    ts: float
    events: Sequence[Any]  # KvEvent, or (known) the typed structs
    dp_rank: int | None = None
    known: bool = False


def _as_map(raw: Any) -> dict[str, Any]:
    """An event as a field map, whichever shape it came in."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        names = POSITIONAL_FIELDS.get(raw[0])
        values = raw[1:]
        if names is None:
            return {"type": raw[0]} | {f"_{i}": v for i, v in enumerate(values, 1)}
        fields = dict(zip(names, values, strict=False))  # trailing defaults omitted
        fields["type"] = raw[0]
        # Fields a newer publisher appended that this decoder has no name for.
        for i in range(len(names), len(values)):
            fields[f"_{i + 1}"] = values[i]
        return fields
    raise KvscopeError(f"event is {type(raw).__name__}, expected a map or a tagged array")


# Shared empties for the usual event, which has no unknown fields (never mutated).
_NOTHING: dict[str, Any] = {}
_NOTHING_LIST: list[int] = []


def decode_event(raw: Any) -> KvEvent:
    """One event from its msgpack-decoded form (map or positional).

    This runs once per event at fleet rates, so it is written for the usual
    case (a map of known fields): no intermediate set, list or call per event.
    """
    fields = raw if type(raw) is dict else _as_map(raw)
    kind = fields.get("type")
    if not isinstance(kind, str):
        raise KvscopeError("event without a string 'type'")
    known = KNOWN_FIELDS.get(kind)
    if known is None:
        return KvEvent(kind, unknown={k: v for k, v in fields.items() if k != "type"})
    if known.issuperset(fields):
        unknown = _NOTHING
    else:
        unknown = {k: v for k, v in fields.items() if k not in known}
    if kind == ALL_BLOCKS_CLEARED:
        return KvEvent(kind, unknown=unknown)
    get = fields.get
    hashes = get("block_hashes", _NOTHING_LIST)
    if type(hashes) is not list:
        raise KvscopeError(f"block_hashes is {type(hashes).__name__}, expected a list")
    parent = get("parent_block_hash")
    extra = {k: fields[k] for k in EXTRA_FIELDS if fields.get(k) is not None}
    if "extra_keys" in extra and not (
        isinstance(extra["extra_keys"], list) and any(extra["extra_keys"])
    ):
        del extra["extra_keys"]  # [None, None, ...]: nothing to keep
    extra = extra or _NOTHING
    try:
        signed = _signed(hashes)
        if parent is not None and parent > _MAX_INT64:
            parent -= _TWO_64
    except TypeError:  # a hash that is no number: a bad message, not a dead subscriber
        raise KvscopeError(f"{kind} with a hash that is not an integer") from None
    for name, types in _SCALARS:
        value = get(name)
        if value is not None and not isinstance(value, types):
            # The recorder keeps these in sets and keys (a list would stop its thread):
            # a bad message, counted and shown, and the stream goes on.
            raise KvscopeError(f"{kind} {name} is {type(value).__name__}")
        if types is int and value is not None:
            _check_int64(kind, name, value)
    return KvEvent(
        kind,
        signed,
        parent,
        get("block_size"),
        get("medium"),
        get("group_idx"),
        get("lora_name"),
        get("kv_cache_spec_kind"),
        unknown,
        extra,
    )


# Known fields the recorder summarises in sets and dict keys, and their types.
_SCALARS = (
    ("medium", str),
    ("group_idx", int),
    ("lora_name", str),
    ("kv_cache_spec_kind", str),
    ("block_size", int),
)
# What SQLite stores of an int field (group_idx, block_size, dp_rank): a signed 64-bit
# integer. A larger one had failed the writer's whole chunk, every source's rows in it.
_INT64 = Annotated[int, msgspec.Meta(ge=_MIN_INT64, le=_MAX_INT64)]
# A batch's timestamp: seconds since 1970 that the run's clock (int64 nanoseconds) can
# hold. NaN, infinity or 1e308 had stopped the recorder's thread, and the watch with it.
MAX_TS = 9.0e9  # the year 2255
_TS = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TS)]


def _check_ts(ts: Any) -> float:
    """A batch's timestamp as a float; raises KvscopeError for anything that is not
    a time the run's clock can hold."""
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0.0 <= ts <= MAX_TS:
        raise KvscopeError(f"batch timestamp {ts!r} is not a time (seconds since 1970)")
    return float(ts)


def _check_int64(kind: str, name: str, value: int) -> None:
    if not _MIN_INT64 <= value <= _MAX_INT64:
        raise KvscopeError(f"{kind} {name} {value} does not fit 64 bits")


# Untyped (plain dicts, lists, ints) so unknown fields and event types survive;
# msgspec decodes these payloads about twice as fast as msgpack does.
_DECODER = msgspec.msgpack.Decoder()


def _known_struct(kind: str) -> type:
    """A struct of exactly ``kind``'s known fields: decoding into it fails, and the
    untyped path takes over, on anything else (an unknown field, a hash that is
    not an integer), so nothing the general path would keep is lost."""
    typed = {
        "block_hashes": (tuple[int, ...], ()),
        "parent_block_hash": (int | None, None),
        # Never stored: kept undecoded (a view of the payload), so that a queue of
        # batches does not hold a Python int per token.
        "token_ids": (msgspec.Raw, None),
        "lookahead_token_ids": (msgspec.Raw, None),
        # Kept in the recorder's sets and keys: anything else is the general path's
        # bad message.
        **{name: ((_INT64 if t is int else t) | None, None) for name, t in _SCALARS},
    }
    fields = [
        (name, *typed.get(name, (Any, None))) for name in sorted(KNOWN_FIELDS[kind] - {"type"})
    ]
    return msgspec.defstruct(
        kind, fields, tag_field="type", tag=kind, forbid_unknown_fields=True, gc=False
    )


StoredEvent, RemovedEvent, ClearedEvent = map(
    _known_struct, (BLOCK_STORED, BLOCK_REMOVED, ALL_BLOCKS_CLEARED)
)
# The usual batch: [ts, map-shaped events of known fields only, dp_rank], decoded
# to C structs with no dict per event (and tuples: see EventBatch).
_KNOWN_EVENT = StoredEvent | RemovedEvent | ClearedEvent  # type: ignore[valid-type]
_FAST_DECODER = msgspec.msgpack.Decoder(tuple[_TS, tuple[_KNOWN_EVENT, ...], _INT64 | None])


def _signed(hashes: Sequence[int]) -> list[int]:
    return [v - _TWO_64 if v > _MAX_INT64 else v for v in hashes]


def _extra(e: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """A typed event's newer per-event fields that are set, as ``KvEvent.extra``."""
    extra = {k: getattr(e, k) for k in names if getattr(e, k) is not None}
    if extra.get("extra_keys") is not None and not any(extra["extra_keys"]):
        del extra["extra_keys"]  # [None, None, ...]: nothing to keep
    return extra or _NOTHING


STORED_EXTRA = EXTRA_FIELDS
REMOVED_EXTRA = ("locality", "ownership")


def stored_extra(e: Any) -> dict[str, Any]:
    """A ``StoredEvent``'s ``KvEvent.extra``: empty (shared, never mutated) in the usual case."""
    if e.session_id is None and e.cache_salt is None and e.locality is None \
            and e.ownership is None and e.extra_keys is None:  # fmt: skip
        return _NOTHING
    return _extra(e, STORED_EXTRA)


def removed_extra(e: Any) -> dict[str, Any]:
    """A ``RemovedEvent``'s ``KvEvent.extra``."""
    if e.locality is None and e.ownership is None:
        return _NOTHING
    return _extra(e, REMOVED_EXTRA)


def as_kv_event(e: Any) -> KvEvent:
    """A typed struct of the usual batch as the ``KvEvent`` the general path makes."""
    cls = type(e)
    if cls is ClearedEvent:
        return KvEvent(ALL_BLOCKS_CLEARED, unknown=_NOTHING)
    if cls is StoredEvent:
        p = e.parent_block_hash
        return KvEvent(
            BLOCK_STORED, _signed(e.block_hashes),
            p if p is None or p <= _MAX_INT64 else p - _TWO_64,
            e.block_size, e.medium, e.group_idx, e.lora_name, e.kv_cache_spec_kind,
            _NOTHING, stored_extra(e),
        )  # fmt: skip
    return KvEvent(BLOCK_REMOVED, _signed(e.block_hashes), None, None, e.medium, e.group_idx,
                   None, None, _NOTHING, removed_extra(e))  # fmt: skip


def _fast_batch(payload: bytes) -> EventBatch | None:
    """The batch if it has the usual shape (``known``), else None (then decode it in full)."""
    try:
        ts, events, dp_rank = _FAST_DECODER.decode(payload)
    except (msgspec.DecodeError, TypeError):  # ValidationError is a DecodeError
        return None
    return EventBatch(ts, events, dp_rank, True)


def decode_batch(payload: bytes) -> EventBatch:
    """A batch from its msgpack bytes, as the watch records it: the usual batch as
    typed structs (``known``), anything else as ``KvEvent``; raises KvscopeError for
    anything malformed."""
    fast = _fast_batch(payload)
    if fast is not None:
        return fast
    try:
        outer = _DECODER.decode(payload)
    except Exception as exc:  # msgspec.DecodeError, or a TypeError for a non-buffer
        raise KvscopeError(f"payload is not msgpack: {exc}") from None
    if not isinstance(outer, list) or len(outer) not in (2, 3):
        raise KvscopeError("payload is not a [ts, events, dp_rank] batch")
    ts, events = outer[0], outer[1]
    if not isinstance(ts, (int, float)) or not isinstance(events, list):
        raise KvscopeError("batch is not [float, list, ...]")
    dp_rank = outer[2] if len(outer) == 3 else None
    if dp_rank is not None and not isinstance(dp_rank, int):  # a stream's key: must hash
        raise KvscopeError(f"batch dp_rank is {type(dp_rank).__name__}, expected an integer")
    if dp_rank is not None:
        _check_int64("batch", "dp_rank", dp_rank)
    return EventBatch(_check_ts(ts), [decode_event(e) for e in events], dp_rank)


def decode_payload(payload: bytes) -> EventBatch:
    """``decode_batch``, its events always ``KvEvent``."""
    batch = decode_batch(payload)
    if batch.known:
        batch.events = [as_kv_event(e) for e in batch.events]
        batch.known = False
    return batch


@dataclass(slots=True)
class Message:
    """One live or replayed message: ``topic`` is None for 2-frame replay replies."""

    topic: bytes | None
    seq: int
    payload: bytes


def parse_live(frames: list[bytes]) -> Message:
    """A PUB message: topic, seq, payload."""
    if len(frames) != 3:
        raise KvscopeError(f"live message of {len(frames)} frames, expected 3")
    return Message(frames[0], unpack_seq(frames[1]), frames[2])


def parse_replay(frames: list[bytes]) -> Message:
    """A replay reply as a DEALER receives it: ``["", topic, seq, payload]`` (vLLM >=
    0.26, SGLang) or ``["", seq, payload]`` (older vLLM)."""
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        return Message(frames[0], unpack_seq(frames[1]), frames[2])
    if len(frames) == 2:
        return Message(None, unpack_seq(frames[0]), frames[1])
    raise KvscopeError(f"replay reply of {len(frames)} frames, expected 2 or 3")
