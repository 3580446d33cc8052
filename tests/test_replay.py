"""The trace replay drives the engine's own KV-cache code: hit rates, policies, timing."""

from __future__ import annotations

import json

import pytest

from kvscope.engine.replay import ReplayConfig, ReplayDriver, prepare, read_replay_trace
from kvscope.engine.replay.sweep import run_sweep, sweep_configs
from kvscope.engine.replay.tokens import PageTokens
from kvscope.engine.replay.traces import page_contents

from support.mooncake_slice import SLICE, reference_ceiling


@pytest.fixture(scope="module")
def trace():
    return read_replay_trace(SLICE)


def test_unlimited_capacity_hits_exactly_the_hand_counted_ceiling(trace):
    result = ReplayDriver(trace, ReplayConfig(capacity_tokens=None, check_every=97)).run()
    assert result.finished == len(trace) == 400
    assert result.evicted_pages == 0
    assert result.hit_rate == pytest.approx(reference_ceiling(SLICE), abs=1e-12)
    assert result.hit_rate > 0.1  # the slice does share prefixes


def test_belady_is_at_least_every_online_policy_at_every_capacity(trace):
    caps = [10_000, 100_000, 300_000, 1_000_000, 3_000_000, 6_000_000]
    configs = sweep_configs(ReplayConfig(), caps, ["lru", "lfu", "fifo", "belady"], [512])
    results = run_sweep(trace, configs, workers=1)
    rate = {
        (c.eviction_policy, c.capacity_tokens): r.hit_rate
        for c, (r, _) in zip(configs, results, strict=True)
    }
    ceiling = reference_ceiling(SLICE)
    for cap in caps:
        for policy in ("lru", "lfu", "fifo"):
            assert rate[("belady", cap)] >= rate[(policy, cap)] - 1e-12, (cap, policy, rate)
        assert rate[("belady", cap)] <= ceiling + 1e-12
    # and it wins somewhere: the bound is not vacuous
    assert any(rate[("belady", c)] > rate[("lru", c)] + 0.01 for c in caps)
    # more capacity never hurts lru here, and the curve rises from ~0 to near the ceiling
    lru = [rate[("lru", c)] for c in caps]
    assert lru == sorted(lru) and lru[-1] > 0.9 * ceiling > lru[0]


def test_integrity_holds_while_evicting(trace):
    small = trace.head(120)
    for policy in ("lru", "belady"):
        cfg = ReplayConfig(capacity_tokens=200_000, eviction_policy=policy, check_every=7)
        result = ReplayDriver(small, cfg).run()
        assert result.evicted_pages > 0 and result.finished == 120


def test_equal_hash_ids_share_pages_and_different_ids_never_collide(trace):
    keys, space = page_contents(trace, 512)
    ids = [e.blocks[: e.input_len // 512] for e in trace.entries]
    mapping: dict[int, int] = {}
    for block_ids, page_keys in zip(ids, keys, strict=True):
        assert len(block_ids) == len(page_keys)
        for b, k in zip(block_ids, page_keys, strict=True):
            assert mapping.setdefault(b, k) == k
    assert len(set(mapping.values())) == len(mapping)  # injective
    # output pages get fresh keys, never a trace content's key
    tokens = PageTokens(keys[0], trace.entries[0].input_len, space, tail=[])
    out = (tokens + [0] * 2000).page_keys(0, (trace.entries[0].input_len + 2000) // 512)
    assert out[: len(keys[0])] == keys[0]
    assert all(k < 0 for k in out[len(keys[0]) :]) and len(out) > len(keys[0])


def test_smaller_pages_than_blocks_find_at_least_the_same_hits(trace):
    small = trace.head(150)
    full = ReplayDriver(small, ReplayConfig(page_size=512)).run()
    half = ReplayDriver(small, ReplayConfig(page_size=256)).run()
    assert half.hit_tokens >= full.hit_tokens
    # a page of two 256-token pieces of one block: keys differ by offset, equal across requests
    keys, _ = page_contents(small, 256)
    assert all(len(k) == e.input_len // 256 for k, e in zip(keys, small.entries, strict=True))


def test_token_id_traces_share_full_pages_only(tmp_path):
    shared = list(range(1000, 1000 + 40))
    lines = [
        {"prompt_token_ids": shared + [1, 2, 3], "max_tokens": 4},
        {"prompt_token_ids": shared + [7, 8], "max_tokens": 4},
        {"prompt_token_ids": shared[:15] + [9], "max_tokens": 2},
    ]
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    trace = read_replay_trace(path)
    assert trace.format == "kvscope" and trace.block_size == 0
    result = ReplayDriver(trace, ReplayConfig(page_size=16, check_every=1)).run()
    # second request: 2 full shared pages (32 tokens); third: none (15 shared < one page)
    assert result.hit_tokens == 32
    assert result.queried_tokens == 43 + 42 + 16


def test_roofline_timing_overlaps_requests_and_reports_ttft(trace):
    small = trace.head(200)
    cfg = ReplayConfig(
        capacity_tokens=400_000, timing="roofline", speed=20.0, check_every=13,
        max_batched_tokens=8192,
    )  # fmt: skip
    result = ReplayDriver(small, cfg).run()
    assert result.finished + result.rejected == 200
    assert result.ttft_p50_s is not None and result.ttft_p99_s >= result.ttft_p50_s > 0
    assert result.queue_p99_s is not None
    assert result.simulated_s > 0 and result.steps > 200
    # at 20x speed the pool is contended: requests preempt each other
    assert result.preemptions > 0
    # decode bursts: far fewer steps than decode tokens
    assert result.steps < sum(e.output_len for e in small.entries) / 2


def test_roofline_with_offload_reloads_from_the_host_tier(trace):
    small = trace.head(150)
    cfg = ReplayConfig(
        capacity_tokens=300_000, timing="roofline", offload="always",
        host_tokens=2_000_000, check_every=11,
    )  # fmt: skip
    result = ReplayDriver(small, cfg).run()
    assert result.offloaded_pages > 0 and result.reloaded_pages > 0
    no_offload = ReplayDriver(small, ReplayConfig(capacity_tokens=300_000, timing="roofline")).run()
    assert result.hit_tokens > no_offload.hit_tokens


def test_prepared_keys_are_shared_between_drivers(trace):
    small = trace.head(50)
    prepared = prepare(small, 512, belady=True)
    a = ReplayDriver(
        small, ReplayConfig(eviction_policy="belady", capacity_tokens=50_000), prepared=prepared
    )
    assert a.prepared is prepared
    b = ReplayDriver(small, ReplayConfig(capacity_tokens=50_000), prepared=prepared)
    assert b.run().requests == a.run().requests == 50


def test_bailian_lines_use_seconds_and_16_token_blocks(tmp_path):
    rows = [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40,
         "output_length": 3, "type": "text", "turn": 1, "hash_ids": [11, 12, 13]},
        {"chat_id": 2, "parent_chat_id": 1, "timestamp": 2.0, "input_length": 70,
         "output_length": 2, "type": "text", "turn": 2, "hash_ids": [11, 12, 13, 14, 15]},
    ]  # fmt: skip
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    trace = read_replay_trace(path)
    assert (trace.format, trace.block_size) == ("bailian", 16)
    assert [e.arrival_s for e in trace.entries] == [0.5, 2.0]
    assert trace.inconsistent == (0, 0)
    # request 2 shares blocks 11, 12 as full pages (block 13 was partial in request 1: 40 = 2.5 x 16)
    result = ReplayDriver(trace, ReplayConfig(page_size=16, check_every=1)).run()
    assert result.hit_tokens == 32
    # at 32-token pages the first page (blocks 11+12) is shared
    assert ReplayDriver(trace, ReplayConfig(page_size=32)).run().hit_tokens == 32
