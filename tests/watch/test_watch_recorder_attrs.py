"""The recorder writes every source's attributes with each flush's counters, made
again only when they changed: what is stored follows every change, flush by
flush, whichever attribute it was."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import msgpack

from kvscope.profiler.watch.recorder import WatchRecorder
from kvscope.profiler.watch.sources import expand_sources
from kvscope.profiler.watch.subscriber import Stream
from kvscope.profiler.watch.wire import decode_batch


def _stored(hashes: list[int], **more: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": [], "block_size": 16, "lora_id": None, "medium": "GPU"} | more  # fmt: skip


def _attrs(path: Path) -> dict[int, dict]:
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT source, attrs FROM watch_sources ORDER BY source").fetchall()
    conn.close()
    return {source: json.loads(text) for source, text in rows}


def test_stored_attributes_follow_each_change(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    recorder = WatchRecorder(path, {})
    streams = []
    for port in (1, 2):
        stream = Stream(
            recorder.next_source_index(), expand_sources(f"tcp://h:{port}")[0], None, ""
        )
        recorder.new_stream(stream)
        streams.append(stream)
    a, b = streams
    changes = [
        {},  # nothing new: the same text again
        {"medium": "CPU"},
        {"kv_cache_spec_kind": "sliding_window", "group_idx": 1},
        {"lora_name": "adapter-a"},
        {"session_id": "s-1"},
        {"session_id": "s-1"},  # seen: no change
        {"cache_salt": "salt"},
        {"locality": "local"},
        {"ownership": "owned"},
        {"extra_keys": [None, ["img", 3]]},
        {"extra_keys": [None, ["img", 4]]},  # only a counter moves
        {"medium": "GPU"},
    ]
    expected_events = 0
    for seq, change in enumerate(changes):
        payload = msgpack.packb([time.time(), [_stored([seq], **change)], 0])
        recorder.on_batch(a, seq, decode_batch(payload))
        recorder.on_batch(b, seq, decode_batch(msgpack.packb([time.time(), [_stored([seq])], 0])))
        recorder.flush()
        expected_events += "extra_keys" in change
        stored = _attrs(path)
        assert stored[a.index] == json.loads(recorder._attrs[a.index].as_json())
        assert stored[b.index] == json.loads(recorder._attrs[b.index].as_json())
        assert stored[a.index]["extra_keys_events"] == expected_events
    recorder.finish()
    final = _attrs(path)[a.index]
    assert final["media"] == ["CPU", "GPU"] and final["groups"] == {"1": "sliding_window"}
    assert final["lora_names"] == ["adapter-a"] and final["session_ids"]["count"] == 1
    assert (final["cache_salts"]["count"], final["localities"], final["ownerships"]) == (
        1,
        ["local"],
        ["owned"],
    )
    assert final["extra_keys_events"] == 2
    assert _attrs(path)[b.index]["media"] == ["GPU"]


def test_a_batch_that_cannot_be_made_into_rows_is_one_bad_message(tmp_path: Path) -> None:
    """Decoding refuses what it knows to be bad (a NaN timestamp among it); whatever else
    fails to become rows is its source's bad message: the thread, and every other
    batch of the flush, go on (it had stopped the recorder's thread, and the watch
    hung)."""
    path = tmp_path / "w.db"
    recorder = WatchRecorder(path, {})
    stream = Stream(recorder.next_source_index(), expand_sources("tcp://h:1")[0], None, "")
    recorder.new_stream(stream)
    good = decode_batch(msgpack.packb([time.time(), [_stored([1, 2])], 0]))
    bad = decode_batch(msgpack.packb([time.time(), [_stored([3])], 0]))
    bad.ts = float("nan")  # past decoding: what the recorder cannot make rows of
    recorder.on_batch(stream, 0, good)
    recorder.on_batch(stream, 1, bad)
    recorder.on_batch(stream, 2, decode_batch(msgpack.packb([time.time(), [_stored([4])], 0])))
    recorder.flush()
    recorder.finish()
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT seq, blocks FROM watch_blocks ORDER BY rowid").fetchall()
    incidents = conn.execute("SELECT kind, first_seq, detail FROM watch_incidents").fetchall()
    (bad_messages,) = conn.execute("SELECT bad_messages FROM watch_sources").fetchone()
    conn.close()
    assert rows == [(0, 2), (2, 1)]
    assert [(k, s) for k, s, _ in incidents] == [("bad_message", 1)]
    assert "could not record the batch" in incidents[0][2] and bad_messages == 1
    assert recorder.last_bad_message.startswith("could not record the batch")
