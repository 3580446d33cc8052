"""Several replicas: on a trace with shared prefixes, a prefix-aware router keeps each
prefix on one replica and beats round-robin, with figures worked out by hand.

The trace: two conversations (A: blocks 1, 2; B: blocks 5, 6), three requests each,
every request its two shared blocks and one block of its own, 4 tokens a block and a
page, 12 prompt tokens (the last-token rule lets at most two pages hit). Arrival
order A A B B A B over two replicas, capacity unlimited:

- round-robin sends A1, B1, A3 to replica 0 and A2, B2, B3 to replica 1: only A3 and
  B3 find their prefix (8 + 8 of 72 tokens); both replicas hold both prefixes (blocks
  1, 1-2, 5, 5-6: four duplicated).
- prefix-aware sends A1 to replica 0 (tie, lowest index), A2 after it (8 hit), B1 to
  replica 1 (no prefix anywhere; replica 1 was given fewer tokens), B2, A3, B3 after
  their prefix (8 each): 32 of 72, and no prefix is held twice.
"""

from __future__ import annotations

import json

import pytest

from kvscope.app.cli import main
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import EventBus
from kvscope.engine.eviction import Belady
from kvscope.engine.page_pool import PagePool
from kvscope.engine.radix_cache import RadixCache
from kvscope.engine.replay.driver import ReplayConfig
from kvscope.engine.replay.routing import replay_replicas
from kvscope.engine.replay.traces import ReplayTrace, TraceEntry

BLOCKS = [[1, 2, 10], [1, 2, 11], [5, 6, 20], [5, 6, 21], [1, 2, 12], [5, 6, 22]]
TRACE = ReplayTrace(
    "shared-prefixes",
    "mooncake",
    4,
    [TraceEntry(float(i), 12, 2, blocks=b) for i, b in enumerate(BLOCKS)],
)
CONFIG = ReplayConfig(capacity_tokens=None, page_size=4, check_every=1)


@pytest.mark.parametrize(
    ("routing", "assignment", "hits", "duplicated"),
    [
        ("round-robin", [0, 1, 0, 1, 0, 1], 16, 4),
        ("least-loaded", [0, 1, 0, 1, 0, 1], 16, 4),
        ("prefix-aware", [0, 0, 1, 1, 0, 1], 32, 0),
    ],
)
def test_prefix_aware_routing_beats_round_robin_by_the_figures(
    routing, assignment, hits, duplicated
):
    result = replay_replicas(TRACE, CONFIG, 2, routing)
    assert result.assignment == assignment
    assert (result.hit_tokens, result.queried_tokens) == (hits, 72)
    assert result.final_duplicated_blocks == duplicated
    assert [r.requests for r in result.replicas] == [3, 3]


def test_capacity_is_split_over_the_replicas():
    # 24 tokens over 2 replicas: 12 each, three pages: one conversation's prefix and its
    # own block fit, so prefix-aware still hits 8 tokens on each of A2, B2, A3, B3.
    result = replay_replicas(
        TRACE, ReplayConfig(capacity_tokens=24, page_size=4), 2, "prefix-aware"
    )
    assert result.hit_tokens == 32 and result.capacity_tokens == 24
    with pytest.raises(KvscopeError, match="less than one page"):
        replay_replicas(TRACE, ReplayConfig(capacity_tokens=6, page_size=4), 2, "round-robin")
    with pytest.raises(KvscopeError, match="routing must be one of"):
        replay_replicas(TRACE, CONFIG, 2, "random")


class _Future(list):
    """Token ids whose pages are all next needed at request ``use`` (belady's key)."""

    def __init__(self, tokens: list[int], use: int) -> None:
        super().__init__(tokens)
        self.use = use

    def next_use(self, page: int) -> int:
        return self.use


def test_eviction_survives_a_heap_rebuild_in_the_middle_of_it():
    """Found by prefix-aware routing under belady: an eviction whose refresh rebuilt the
    heap went on popping the old list, ran out, and raised IndexError."""
    pool = PagePool(200, 2)
    cache = RadixCache(pool, EventBus(), Belady())
    # G -> P -> 40 leaves: evicting the last leaf exposes P, evicting P exposes G.
    requests = [[1, 2, 3, 4, 10 + 2 * i, 11 + 2 * i, 99] for i in range(40)]
    use = 0

    def visit(tokens: list[int]) -> None:
        nonlocal use
        use += 1
        pages, _ = cache.match(_Future(tokens, use))
        pages += pool.allocate(3 - len(pages))
        cache.insert(tokens[:6], pages)
        cache.release(pages)

    for tokens in requests:
        visit(tokens)
    # Re-key the leaves (each visit leaves a stale heap entry behind, keyed later than
    # every live one) up to the rebuild threshold.
    i = 0
    while len(cache._heap) < 2 * len(cache._evictable) + 64:
        visit(requests[i % 40])
        i += 1
    assert cache.evict(1000) == 42
    cache.check_integrity()


def test_kvscope_replay_replicas_prints_and_returns_the_routings(capsys, tmp_path):
    path = tmp_path / "shared.jsonl"
    lines = [
        json.dumps({"timestamp": i, "input_length": 12, "output_length": 2, "hash_ids": b})
        for i, b in enumerate(BLOCKS)
    ]
    path.write_text("\n".join(lines) + "\n")
    argv = ["replay", str(path), "--block-size", "4", "--capacity", "24"]
    argv += ["--eviction-policy", "lru", "--replicas", "2", "--quiet", "--workers", "1"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {(r["capacity_tokens"], r["routing"]): r["hit_tokens"] for r in out["replicas"]}
    # At 12 tokens (3 pages) a replica, round-robin's replica 0 holds B1 when A3 comes:
    # only B3 (after B2 on replica 1) hits.
    assert got == {
        (24, "round-robin"): 8,
        (24, "prefix-aware"): 32,
        (None, "round-robin"): 16,
        (None, "prefix-aware"): 32,
    }
    unlimited = next(p for p in out["points"] if p["capacity_tokens"] is None)
    # One engine, unlimited: A2, B2, A3, B3 hit 8 each; every request's last token and
    # its own block (cold) miss: 72 - 32 = 40 missed, 6 of them last tokens.
    assert unlimited["miss_reasons"]["last_token"] == 6
    assert unlimited["miss_reasons"]["cold"] == 34
    assert main([*argv, "--routing", "least-loaded"]) == 0
    text = capsys.readouterr().out
    assert "Why missed tokens missed" in text and "2 replicas" in text
    assert "least-loaded" in text
    db = tmp_path / "none.db"
    assert main([*argv, "--routing", "random", "--db", str(db)]) == 2
    assert "unknown routing 'random'" in capsys.readouterr().err
    assert main([*argv, "--replicas", "8", "--db", str(db)]) == 2  # 3 tokens a replica
    assert "less than one page" in capsys.readouterr().err
    assert not db.exists()  # refused before anything was recorded
