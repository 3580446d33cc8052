"""The engine's scheduler and KV manager under random load, on a tiny random model.

Invariants after every step (no page both free and owned, every reference
accounted for, the prefix cache's heap live entries exactly its evictable
leaves, all pages back when all requests finish) under random arrivals, every
eviction policy, tiny budgets, chunked prefill and both preemption modes; and the
same greedy tokens whatever the cache configuration.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.engine.sampler import SamplingParams
from kvscope.engine.scheduler import Scheduler
from kvscope.engine.tiny import tiny_engine

from support.engine_runs import run_all

prompts = st.lists(st.integers(1, 63), min_size=1, max_size=30)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), prompts, st.integers(1, 12)), min_size=1, max_size=10),
    st.sampled_from([3, 4, 8]),
    st.booleans(),
    st.sampled_from(["recompute", "swap"]),
    st.integers(4, 64),
    st.sampled_from(["lru", "lfu", "fifo"]),
)
def test_invariants_under_random_load(
    arrivals, page_size, prefix, preemption, budget_tokens, policy
):
    longest = max(len(p) + n for _, p, n in arrivals)
    pages = max(budget_tokens // page_size, -(-longest // page_size) + 1)
    engine = tiny_engine(
        pages,
        page_size,
        prefix_cache=prefix,
        preemption=preemption,
        offload="always" if prefix else "never",
        max_batched_tokens=16,
        eviction_policy=policy,
    )
    outputs = run_all(engine, arrivals)
    assert sorted(outputs) == list(range(len(arrivals)))
    assert all(len(outputs[i]) == n for i, (_, _, n) in enumerate(arrivals))
    held_by_cache = engine.kv.prefix.device_pages if prefix else 0
    assert engine.kv.pool.num_used == held_by_cache
    assert not engine.kv.holders


def _workload(seed: int) -> list[tuple[int, list[int], int]]:
    rng = random.Random(seed)
    stem = [rng.randint(1, 63) for _ in range(13)]
    return [
        (
            rng.randint(0, 6),
            stem + [rng.randint(1, 63) for _ in range(rng.randint(1, 9))],
            rng.randint(4, 14),
        )
        for _ in range(8)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_tokens_whatever_the_cache_does(seed):
    work = _workload(seed)
    baseline = run_all(tiny_engine(200, prefix_cache=False, chunked_prefill=False), work)
    variants = {
        "prefix cache": tiny_engine(200),
        "chunked prefill": tiny_engine(200, max_batched_tokens=5),
        "recompute preemption": tiny_engine(12, prefix_cache=False),
        "swap preemption": tiny_engine(12, prefix_cache=False, preemption="swap"),
        "eviction + offload": tiny_engine(14, offload="always", max_batched_tokens=7),
    }
    for name, engine in variants.items():
        assert run_all(engine, work) == baseline, name
    # the small-budget variants really did preempt / evict
    assert variants["recompute preemption"].scheduler and any(
        r.num_preemptions for r in variants["recompute preemption"].requests.values()
    )
    assert any(r.num_preemptions for r in variants["swap preemption"].requests.values())


class _GeneralOnly(Scheduler):
    """The scheduler without its steady-state batch: every step through the general loop."""

    def _steady(self, budget: int) -> None:
        return None


@pytest.mark.parametrize(
    ("preemption", "max_seqs"), [("recompute", 256), ("swap", 256), ("recompute", 3)]
)
def test_the_steady_state_batch_is_the_general_loops_batch(preemption, max_seqs):
    """Tight pages (evictions, preemptions), staggered arrivals, requests waiting behind
    the sequence limit: the scheduler's one-pass
    batch, where it applies, is exactly what the general loop schedules, step by step,
    and it does apply to many of them."""
    rng = random.Random(5)
    prefix = [rng.randrange(1, 64) for _ in range(12)]
    arrivals = [
        (i * 3, prefix + [rng.randrange(1, 64) for _ in range(rng.randrange(1, 20))], 25)
        for i in range(12)
    ]
    engines = [tiny_engine(40, preemption=preemption, max_num_seqs=max_seqs) for _ in range(2)]
    general = engines[1]
    general.scheduler = _GeneralOnly(general.config, general.kv)
    steady = 0
    original = engines[0].scheduler._steady

    def counted(budget: int):
        nonlocal steady
        batch = original(budget)
        steady += batch is not None and bool(batch.requests)
        return batch

    engines[0].scheduler._steady = counted
    pending = list(arrivals)
    outputs: list[dict[int, list[int]]] = [{}, {}]
    step = 0
    while pending or engines[0].has_unfinished() or engines[1].has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, n = pending.pop(0)
            for e in engines:
                e.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
        seen = []
        for e, out in zip(engines, outputs, strict=True):
            got = e.step()
            for o in got:
                out[o.request_id] = o.token_ids
            seen.append(
                (
                    [r.request_id for r in e.scheduler.running],
                    [(o.request_id, o.new_token_ids, o.finished) for o in got],
                    sorted(e.kv.page_holds().items()),
                )
            )
            e.kv.check_integrity()
        assert seen[0] == seen[1], step
        step += 1
        assert step < 2000
    assert outputs[0] == outputs[1] and len(outputs[0]) == len(arrivals)
    assert steady >= step // 4  # taken on a good share of the steps (26 of 67 here)


def test_outputs_carry_the_tokens_as_they_were_at_their_step():
    """``RequestOutput.token_ids`` (built when read) is the request's output at the step
    that produced it, even when read after later steps appended more."""
    engine = tiny_engine(64)
    for n in (5, 9):
        engine.add_request(list(range(1, 10 + n)), SamplingParams(max_tokens=n, ignore_eos=True))
    outs = list(engine.stream())
    final = {o.request_id: o.token_ids for o in outs if o.finished}
    seen: dict[int, int] = {}
    for o in outs:
        seen[o.request_id] = seen.get(o.request_id, 0) + 1
        assert o.token_ids == final[o.request_id][: seen[o.request_id]]
        assert o.new_token_ids == [o.token_ids[-1]]
    assert seen == {0: 5, 1: 9}
    assert outs[0] == outs[0] and outs[0] != outs[1]
    assert repr(outs[0]).startswith("RequestOutput(request_id=0, ")
