"""Rows from decoded batches: the usual batch's typed fast path makes exactly the
rows and source attributes the general path makes from the same events; runs of
plain removals share a row, and the aggregates folded from them are the same as
from a row per event."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import msgpack
import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.db.watch_batch import WatchBatch, unpack_hashes
from kvscope.db.watch_schema import OP_REMOVED, OP_STORED
from kvscope.profiler.watch.rows import SourceAttrs, batch_rows
from kvscope.profiler.watch.wire import EventBatch, decode_batch, decode_payload
from kvscope.profiler.watch.writer import WatchWriter

from support.watch_helpers import new_watch_run

INT64 = st.integers(-(2**63), 2**63 - 1)
UINT64 = st.integers(0, 2**64 - 1)


def _rows(batch: EventBatch, source: int = 0, seq: int = 0, ts_ns: int = 5):
    attrs = SourceAttrs()
    blocks: list[tuple] = []
    raw: list[tuple] = []
    hash_lists: list = []
    batch_rows(source, seq, ts_ns, batch, attrs, blocks, raw, hash_lists)
    hash_lists = unpack_hashes(hash_lists)  # as the writer folds them
    return blocks, raw, hash_lists, attrs


def _both_paths(events: list[dict[str, Any]]) -> tuple[EventBatch, EventBatch]:
    """The same events as the usual 3-element batch (typed fast path) and as a
    2-element one (SGLang's shape: the general path)."""
    fast = decode_batch(msgpack.packb([1.0, events, 0]))
    general = decode_batch(msgpack.packb([1.0, events]))
    assert fast.known and not general.known
    return fast, general


@given(st.lists(INT64, max_size=20))
def test_msgspec_json_text_is_the_repr_without_spaces(values: list[int]) -> None:
    for hashes in (values, [0, -1, 1, 2**63 - 1, -(2**63), 2**32, -(2**32) - 1]):
        assert msgspec.json.encode(hashes).decode() == repr(hashes).replace(" ", "")


_MEDIA = st.sampled_from([None, "GPU", "CPU"])
_GROUPS = st.sampled_from([None, 0, 1])


def _maybe(key: str, values: list[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.sampled_from([{}, *({key: v} for v in values)])


@st.composite
def _event(draw: st.DrawFn, pool: list[int]) -> dict[str, Any]:
    hashes = draw(st.lists(st.sampled_from(pool) | UINT64, max_size=4))
    kind = draw(st.sampled_from(["BlockStored", "BlockRemoved", "BlockRemoved", "Cleared"]))
    if kind == "Cleared":
        return {"type": "AllBlocksCleared"}
    if kind == "BlockRemoved":
        event = {"type": kind, "block_hashes": hashes, "medium": draw(_MEDIA)}
        event |= draw(_maybe("group_idx", [0, 1]))
        event |= draw(_maybe("locality", ["local", None]))
        return event | draw(_maybe("ownership", ["owned"]))
    event = {
        "type": kind, "block_hashes": hashes, "parent_block_hash": draw(st.none() | UINT64),
        "token_ids": [1, 2], "block_size": draw(st.sampled_from([None, 16])), "lora_id": None,
        "medium": draw(_MEDIA), "group_idx": draw(_GROUPS),
        "kv_cache_spec_kind": draw(st.sampled_from([None, "full_attention", "sliding_window"])),
    }  # fmt: skip
    for key, values in (
        ("lora_name", ["adapter-a", None]),
        ("extra_keys", [None, [None, None], [None, ["img", 3]]]),
        ("session_id", ["s-1", "s-2"]),
        ("cache_salt", ["salt"]),
        ("locality", ["remote"]),
        ("ownership", ["shared"]),
        ("lookahead_token_ids", [[7, 8]]),
    ):
        event |= draw(_maybe(key, values))
    return event


@settings(max_examples=300, deadline=None)
@given(st.lists(_event([1, 2**63, 2**64 - 1, 5]), max_size=12))
def test_the_typed_fast_path_makes_the_general_paths_rows(events: list[dict]) -> None:
    fast, general = _both_paths(events)
    assert len(fast.events) == len(general.events) == len(events)  # stream.events counts these
    f_blocks, f_raw, f_hashes, f_attrs = _rows(fast)
    g_blocks, g_raw, g_hashes, g_attrs = _rows(general)
    assert f_blocks == g_blocks and f_hashes == g_hashes and f_raw == g_raw == []
    assert f_attrs == g_attrs and f_attrs.as_json() == g_attrs.as_json()
    for row, hashes in zip(f_blocks, f_hashes, strict=True):
        if row[4] is not None:
            assert json.loads(row[4]) == hashes and row[8] == len(hashes)
            assert all(-(2**63) <= h < 2**63 for h in hashes)
    assert sum(row[8] for row in f_blocks) == f_attrs.block_events
    assert f_attrs.block_events == sum(len(e.get("block_hashes", [])) for e in events)
    # decode_payload gives KvEvents on both paths, alike.
    assert decode_payload(msgpack.packb([1.0, events, 0])).events == general.events


def _removed(hashes: list[int], medium: str | None = "GPU", **more: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium} | more


def _stored(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": [], "block_size": 16, "lora_id": None, "medium": medium}  # fmt: skip


def test_runs_of_plain_removals_share_a_row() -> None:
    big = 2**64 - 2
    events = [
        _removed([9]),
        _removed([10]),  # the same shelf: one row
        _removed([11]),
        _stored([1, 2]),  # none of the removals' hashes: they may go after it
        _removed([1]),
        _removed([2, big]),
        _removed([2]),  # a second copy of 2: kept twice, the fold removes two
        _removed([3], "CPU"),  # another medium: a row of its own
        _removed([4], "CPU", locality="local"),  # an extra field: a row of its own
        _removed([5], "CPU"),
        _removed([6], "CPU", group_idx=1),  # another group
        _stored([7]),
        _removed([7]),
        {"type": "AllBlocksCleared"},  # the removals before it stay before it
        _removed([8]),
        _removed([12]),
        _removed([13]),
        _stored([13]),  # stored again: the removals of 13 go before it
    ]
    for batch in _both_paths(events):
        blocks, _, hash_lists, attrs = _rows(batch)
        got = [(row[3], row[4], row[6], row[7], row[8]) for row in blocks]
        assert got == [
            (OP_STORED, "[1,2]", "GPU", None, 2),
            (OP_REMOVED, f"[9,10,11,1,2,{big - 2**64},2]", "GPU", None, 7),
            (OP_REMOVED, "[3]", "CPU", None, 1),
            (OP_REMOVED, "[4]", "CPU", None, 1),
            (OP_REMOVED, "[5]", "CPU", None, 1),
            (OP_REMOVED, "[6]", "CPU", 1, 1),
            (OP_STORED, "[7]", "GPU", None, 1),
            (OP_REMOVED, "[7]", "GPU", None, 1),
            (3, None, None, None, 0),
            (OP_REMOVED, "[8,12,13]", "GPU", None, 3),
            (OP_STORED, "[13]", "GPU", None, 1),
        ]
        assert hash_lists[1] == [9, 10, 11, 1, 2, big - 2**64, 2] and hash_lists[8] is None
        assert attrs.block_events == sum(row[8] for row in blocks) == 19 and attrs.localities == {
            "local"
        }
    # The general path's KvEvents are left as decoded (the run is a copy).
    general = _both_paths(events)[1]
    assert general.events[1].block_hashes == [10]


def test_an_unknown_field_keeps_its_removal_apart_and_raw() -> None:
    events = [_removed([1]), _removed([2], brand_new=1), _removed([3])]
    batch = decode_batch(msgpack.packb([1.0, events, 0]))
    assert not batch.known
    blocks, raw, _, _ = _rows(batch)
    assert [row[4] for row in blocks] == ["[1]", "[2]", "[3]"]
    assert [r[3:] for r in raw] == [("BlockRemoved", '{"brand_new": 1}')]


# --- the aggregates: merged removal rows fold as a row per event does ------------------

AGGREGATES = (
    "watch_source_stats", "watch_live", "watch_series", "watch_fleet_series", "watch_fleet",
    "watch_histograms", "watch_shared_prefixes",
)  # fmt: skip


def _fleet(rng: random.Random, sources: int = 3, batches: int = 120) -> list[tuple]:
    """(source, seq, ts_ns, events) of a small fleet sharing prefixes: chains stored,
    runs of removals (of blocks held, held twice, never stored, on two media)."""
    out = []
    held: dict[int, list[int]] = {s: [] for s in range(sources)}
    for seq in range(batches):
        source = rng.randrange(sources)
        events: list[dict] = []
        for _ in range(rng.randint(1, 6)):
            roll = rng.random()
            if roll < 0.4:
                chain = [rng.randrange(40) for _ in range(rng.randint(1, 3))]
                events.append(_stored(chain, rng.choice(["GPU", "GPU", "CPU"])))
                held[source] += chain
            elif roll < 0.95:
                mine = held[source]
                for _ in range(rng.randint(1, 4)):  # a run of removals, one hash or two
                    if mine and rng.random() < 0.85:
                        gone = [mine.pop(rng.randrange(len(mine)))]
                    else:
                        gone = [rng.randrange(40, 60)]  # never stored here
                    if mine and rng.random() < 0.3:
                        gone.append(mine.pop(rng.randrange(len(mine))))
                    events.append(_removed(gone, rng.choice(["GPU", "GPU", "CPU"])))
            else:
                events.append({"type": "AllBlocksCleared"})
                held[source] = []
        out.append((source, seq, 1_000_000_000 * (1 + seq // 3), events))
    return out


def _fold(path: Path, rows: list[tuple], hash_lists: list, sources: int = 3) -> dict:
    db, run_id = new_watch_run(path)
    writer = WatchWriter(db, run_id)
    registered = [(i, "events", "vllm", f"tcp://h:{i}", None, "", 0, 0) for i in range(sources)]
    writer.write(WatchBatch(sources=registered))
    # Two transactions (the state carries over), split between timestamps as the
    # recorder's are between batches: the fold notes its figures once a run of rows.
    half = next(i for i in range(len(rows) // 2, len(rows)) if rows[i][2] != rows[i - 1][2])
    writer.write(WatchBatch(blocks=rows[:half], hash_lists=hash_lists[:half]))
    writer.write(WatchBatch(blocks=rows[half:], hash_lists=hash_lists[half:]))
    writer.finish("complete", 0)
    db.conn.close()
    conn = sqlite3.connect(path)
    tables = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in AGGREGATES}
    # What each hash went through in each batch, in order: a batch's removals may share a
    # row after its stores of other hashes, never move past an event of their own hash.
    ops: dict[tuple, list[int]] = {}
    for source, ts_ns, op, h in conn.execute(
        "SELECT source, ts_ns, op, value FROM watch_blocks, json_each(block_hashes) "
        "ORDER BY watch_blocks.rowid, json_each.key"
    ):
        ops.setdefault((source, ts_ns, h), []).append(op)
    tables["blocks"] = sorted(ops.items())
    conn.close()
    return tables


def test_merged_removals_fold_as_a_row_per_event(tmp_path: Path) -> None:
    for seed in range(8):
        fleet = _fleet(random.Random(seed))
        merged: tuple[list, list] = ([], [])
        apart: tuple[list, list] = ([], [])
        for source, seq, ts_ns, events in fleet:
            batch = decode_batch(msgpack.packb([ts_ns / 1e9, events, 0]))
            batch_rows(source, seq, ts_ns, batch, SourceAttrs(), merged[0], [], merged[1])
            for event in events:  # one event a batch: nothing to merge
                one = decode_batch(msgpack.packb([ts_ns / 1e9, [event], 0]))
                batch_rows(source, seq, ts_ns, one, SourceAttrs(), apart[0], [], apart[1])
        assert len(merged[0]) < len(apart[0])  # the fleet had runs to merge
        a = _fold(tmp_path / f"merged-{seed}.db", *merged)
        b = _fold(tmp_path / f"apart-{seed}.db", *apart)
        assert a["watch_source_stats"] and a["watch_histograms"] and a["watch_live"]
        for table in a:
            assert a[table] == b[table], (seed, table)


def test_no_group_and_group_0_are_one_shelf_to_share_a_row() -> None:
    """vLLM's BlockStored names group 0 where its BlockRemoved may name none: the fold
    keeps both on group 0's shelf, so the removals share a row across the store."""
    events = [_removed([1]), _stored([2]) | {"group_idx": 0}, _removed([3])]
    for batch in _both_paths(events):
        blocks, _, _, _ = _rows(batch)
        assert [(row[3], row[4], row[7]) for row in blocks] == [
            (OP_STORED, "[2]", 0),
            (OP_REMOVED, "[1,3]", None),
        ]
    events[1]["group_idx"] = 1  # another group: the removal before it stays before it
    for batch in _both_paths(events):
        blocks, _, _, _ = _rows(batch)
        assert [row[4] for row in blocks] == ["[1]", "[2]", "[3]"]


def test_packed_hashes_come_back_signed_whatever_their_sign() -> None:
    """The usual batch hands its hashes to the writer packed: vLLM's unsigned (>= 2^63
    too) and signed ones (SGLang's sign in a 3-element batch); unpacked, they are the
    general path's lists, and the rows' text is the same."""
    big = 2**64 - 5
    events = [_stored([1, big]), _stored([-3, 4]), _removed([big, 7, -(2**63)])]
    # one hash an event (packed without arrays): each sign, and both ends of 64 bits
    events += [_stored([v]) for v in (big, -3, 2**63, 2**63 - 1, 0)] + [_removed([2**64 - 1])]
    fast, general = _both_paths(events)
    raw_lists: list = []
    batch_rows(0, 0, 5, fast, SourceAttrs(), [], [], raw_lists)
    assert [type(h) for h in raw_lists] == [bytes] * 9
    got, want = _rows(fast), _rows(general)
    assert got[0] == want[0] and got[2] == want[2]
    assert [row[4] for row in got[0]] == [
        f"[1,{big - 2**64}]",
        "[-3,4]",
        f"[{big - 2**64},7,{-(2**63)}]",
        f"[{big - 2**64}]", "[-3]", f"[{-(2**63)}]", f"[{2**63 - 1}]", "[0]", "[-1]",
    ]  # fmt: skip
    assert got[2] == [
        [1, big - 2**64], [-3, 4], [big - 2**64, 7, -(2**63)],
        [big - 2**64], [-3], [-(2**63)], [2**63 - 1], [0], [-1],
    ]  # fmt: skip
