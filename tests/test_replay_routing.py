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

import pytest

from engine.errors import KvscopeError
from engine.replay.driver import ReplayConfig
from engine.replay.routing import replay_replicas
from engine.replay.traces import ReplayTrace, TraceEntry

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
