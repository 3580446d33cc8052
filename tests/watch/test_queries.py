"""Derived watch queries on a hand-built recording whose every figure is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from db import watch_queries as q
from db.store import open_db
from db.watch_schema import OP_CLEARED, OP_REMOVED, OP_STORED
from db.watch_writer import WatchBatch, WatchWriter
from db.writer import create_run

A, B, C, D, E = 11, -22, 2**63 - 1, -(2**63), 55  # signed, as stored
S = 1_000_000_000  # ns per second


def _event(source: int, seq: int, t_s: float, op: int, hashes=(), parent=None, medium="GPU"):
    text = None if op == OP_CLEARED else "[" + ",".join(map(str, hashes)) + "]"
    return (source, seq, int(t_s * S), op, text, parent, medium, 0, len(hashes))


@pytest.fixture
def recording(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "w.db"
    db = open_db(path)
    run_id = create_run(
        db,
        kind="watch",
        model=None,
        config={},
        hardware={},
        versions={},
        started_at=0.0,
        start_ns=0,
    )
    writer = WatchWriter(db, run_id)
    sources = [
        (0, "events", "vllm", "tcp://a:1", None, "", None, 0),
        (1, "events", "vllm", "tcp://b:1", None, "", None, 0),
        (2, "events", "sglang", "tcp://c:1", None, "", None, 0),
    ]
    blocks = [
        _event(0, 0, 1.0, OP_STORED, [A, B, C]),
        _event(1, 0, 1.5, OP_STORED, [A, B]),
        _event(2, 0, 1.6, OP_STORED, [A]),  # same number, other engine kind: not a duplicate
        _event(0, 1, 2.0, OP_STORED, [D], parent=B),
        _event(0, 2, 2.5, OP_STORED, [B], parent=A, medium="CPU"),
        _event(0, 3, 3.0, OP_REMOVED, [A]),
        _event(0, 4, 4.0, OP_STORED, [A]),  # recomputed after its eviction
        _event(0, 5, 5.0, OP_STORED, [C], parent=B),  # re-announced: still cached
        _event(0, 6, 6.0, OP_CLEARED),
        _event(0, 7, 7.0, OP_STORED, [E]),
    ]
    counters = [
        (16, 7, 8, 8, 9, 0, 0, 0, 0, 0, 0, "{}", 0),
        (16, 0, 1, 1, 2, 0, 0, 0, 0, 0, 0, "{}", 1),
        (4, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, "{}", 2),
    ]
    writer.write(WatchBatch(sources=sources, blocks=blocks, counters=counters))
    db.conn.close()
    return path, run_id


def test_block_stats(recording) -> None:
    path, run_id = recording
    result = q.replay(path, run_id)
    first, second, third = q.block_stats(result)
    assert (first.stored, first.removed, first.reannounced, first.recomputed) == (8, 1, 1, 1)
    assert (first.clears, first.resets, first.removed_unknown) == (1, 0, 0)
    assert first.cached == {"GPU": 1}  # only E after the clear
    assert (first.lifetime_count, first.lifetime_mean_s) == (1, 2.0)  # A: stored 1 s, removed 3 s
    assert second.cached == {"GPU": 2} and third.cached == {"GPU": 1}


def test_cached_series_by_medium(recording) -> None:
    path, run_id = recording
    series = q.replay(path, run_id).cached_series
    at = {(p.t_s, p.source, p.medium): p.blocks for p in series}
    assert at[(2.5, 0, "GPU")] == 4 and at[(2.5, 0, "CPU")] == 1
    assert at[(3.0, 0, "GPU")] == 3
    assert at[(6.0, 0, "GPU")] == 0 and at[(6.0, 0, "CPU")] == 0  # AllBlocksCleared
    assert at[(7.0, 0, "GPU")] == 1


def test_duplicates_across_replicas_of_one_engine_kind(recording) -> None:
    path, run_id = recording
    result = q.replay(path, run_id)
    extra = {p.t_s: p.extra_copies for p in result.duplicate_series if p.engine == "vllm"}
    # A and B on both vLLM replicas; B's CPU copy on source 0 is not another replica.
    assert extra[1.5] == 2 and extra[2.5] == 2 and extra[3.0] == 1 and extra[4.0] == 2
    assert extra[7.0] == 0  # source 0 cleared its cache
    sglang, vllm = q.duplication(path, run_id, result)
    assert (vllm.engine, vllm.duplicated_blocks, vllm.extra_copies, vllm.peak_extra_copies) == (
        "vllm",
        0,
        0,
        2,
    )
    assert (sglang.engine, sglang.peak_extra_copies) == ("sglang", 0)


def test_prefix_tree_from_parent_chains(recording) -> None:
    path, run_id = recording
    (top,) = q.prefix_tree(path, run_id)
    assert (top.engine, top.block_hash, top.depth_blocks, top.prefix_tokens) == ("vllm", B, 2, 32)
    assert (top.branches, top.subtree_blocks, top.sources) == (2, 3, (0, 1))


def test_block_hashes_view_rebuilds_parents(recording) -> None:
    path, _ = recording
    db = open_db(path)
    rows = db.execute(
        "SELECT block_hash, parent_hash FROM watch_block_hashes WHERE source = 0 AND seq = 0 "
        "ORDER BY position"
    ).fetchall()
    db.conn.close()
    assert rows == [(A, None), (B, A), (C, B)]


def test_counter_rates_survive_resets() -> None:
    points = [q.MetricPoint(float(t), v) for t, v in enumerate([0, 10, 20, 5, 15])]
    assert [p.value for p in q.counter_rate(points)] == [10, 10, 5, 10]
    hits = [q.MetricPoint(float(t), v) for t, v in enumerate([0, 5, 5, 30])]
    queries = [q.MetricPoint(float(t), v) for t, v in enumerate([0, 10, 10, 40])]
    # The idle interval (no queries) has no hit rate rather than a division by zero.
    assert [(p.t_s, p.value) for p in q.ratio_of_rates(hits, queries)] == [
        (1.0, 0.5),
        (3.0, 25 / 30),
    ]
