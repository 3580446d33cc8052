"""With the real model: greedy output is identical whatever the KV cache does.

Prefix cache on and off, chunked prefill on and off, forced preemption by
recompute and by swap, forced offload: the same tokens, and each mode really
happened (counted from the engine's own events).
"""

from __future__ import annotations

import pytest

from kvscope.app.workloads import SYSTEM_PROMPT
from kvscope.engine.events import EventBus
from kvscope.engine.sampler import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is a KV cache?",
    "Why is decoding slow?",
    "What is paged attention?",
    "How big is a page?",
    "What is GQA?",
    "Why evict pages?",
]
NEW = 16


def _run(make_engine, **config):
    bus = EventBus()
    kinds: dict[str, int] = {}
    bus.subscribe(lambda e: kinds.__setitem__(e.kind, kinds.get(e.kind, 0) + 1))
    engine = make_engine(**config)
    engine.bus = bus
    engine.kv.bus = bus
    if engine.kv.prefix is not None:
        engine.kv.prefix.bus = bus
    prompts = [
        engine.codec.render_chat(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}]
        )
        for q in QUESTIONS
    ]
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW, ignore_eos=True))
    engine.kv.check_integrity()
    return [o.token_ids for o in outs], kinds


@pytest.fixture(scope="module")
def baseline(make_engine):
    tokens, _ = _run(make_engine, prefix_cache=False, chunked_prefill=False)
    return tokens


def test_prefix_cache_on_matches_off(make_engine, baseline):
    tokens, kinds = _run(make_engine)
    assert tokens == baseline
    assert kinds["prefix_lookup"] == len(QUESTIONS) and kinds["block_stored"] > 0


def test_chunked_prefill_matches(make_engine, baseline):
    tokens, kinds = _run(make_engine, prefix_cache=False, max_batched_tokens=64)
    assert tokens == baseline
    assert kinds["chunk_scheduled"] > len(QUESTIONS)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_forced_preemption_matches(make_engine, baseline, mode):
    # ~197-token prompts take 13 pages each: two are admitted into 27 pages, then cannot both grow.
    tokens, kinds = _run(
        make_engine, prefix_cache=False, kv_budget_bytes=27 * 16 * 46080, preemption=mode
    )
    assert tokens == baseline
    assert kinds["request_preempted"] > 0 and kinds["request_resumed"] > 0


def test_forced_offload_matches(make_engine, baseline):
    tokens, kinds = _run(make_engine, kv_budget_bytes=20 * 16 * 46080, offload="always")
    assert tokens == baseline
    assert kinds["page_offloaded"] > 0 and kinds["page_reloaded"] > 0
