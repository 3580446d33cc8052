"""InfLLM attention on the tiny model: retrieval, exactness with every block retrieved, events."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch

from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import EventBus, InfLLMRetrieval
from kvscope.engine.infllm import OFFLOADED, RequestMemory
from kvscope.engine.model import apply_rotary
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import VOCAB, tiny_loaded
from kvscope.profiler.recorder import Recorder

PAGE = 4
INFLLM = dict(
    attention_mode="infllm",
    infllm_initial_tokens=8,
    infllm_local_tokens=16,
    infllm_block_pages=2,
)


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded(max_position=1024)


def prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def engine(loaded, bus: EventBus | None = None, **overrides) -> Engine:
    config = dict(page_size=PAGE, kv_budget_bytes=1 << 20, max_batched_tokens=64) | overrides
    return Engine(EngineConfig(**config), bus=bus, loaded=loaded)


def run_checked(eng: Engine, prompts: list[list[int]], max_tokens: int = 20) -> list[list[int]]:
    """Generate, checking the KV manager's integrity after every step."""
    ids = [eng.add_request(p, SamplingParams(max_tokens=max_tokens)) for p in prompts]
    while eng.has_unfinished():
        eng.step()
        eng.kv.check_integrity()
    if eng.kv.infllm is not None:  # no prefix cache: nothing outlives the requests
        assert eng.kv.pool.num_used == 0 and eng.kv.host.num_used == 0
    return [eng.requests[i].output_ids for i in ids]


def test_all_blocks_retrieved_equals_full_attention(loaded):
    prompts = [prompt(300), prompt(170, seed=2)]
    full = run_checked(engine(loaded), prompts)
    infllm = run_checked(engine(loaded, **INFLLM, infllm_topk_blocks=1000), prompts)
    assert infllm == full


def test_few_blocks_keep_resident_pages_bounded(loaded):
    bus = EventBus()
    events: list[InfLLMRetrieval] = []
    bus.subscribe(lambda e: events.append(e) if isinstance(e, InfLLMRetrieval) else None)
    eng = engine(loaded, bus, **INFLLM, infllm_topk_blocks=2, max_batched_tokens=16)
    run_checked(eng, [prompt(300)])
    page_bytes = eng.storage.nbytes // eng.num_pages
    # sinks (2) + local window (4) and its block of slack (2) + the step's chunk (4)
    # + 2 retrieved blocks of 2 pages: never more. Plus each block's 2 fp16 centroids.
    bound = (2 + 4 + 2 + 4 + 2 * 2) * page_bytes
    layers, _, _, _, kv_heads, head_dim = eng.storage.data.shape
    summary = layers * 2 * kv_heads * head_dim * 2
    assert events and all(e.resident_bytes <= bound + e.blocks_total * summary for e in events)
    assert max(e.resident_bytes - e.blocks_total * summary for e in events) > bound // 2
    last = events[-1]
    totals = [e.blocks_total for e in events]
    assert totals == sorted(totals) and last.blocks_total >= (300 - 8 - 16 - 8) // (2 * PAGE)
    assert all(len(e.chosen_blocks) <= 2 * 2 for e in events)  # 2 per layer, 2 layers
    # Each of the 2 layers chooses min(2, blocks) a step; reloads + hits account for each choice.
    assert all(
        sum(e.chosen_layers) == 2 * min(2, e.blocks_total) == e.blocks_reloaded + e.cache_hits
        for e in events
    )
    assert any(e.cache_hits for e in events) and any(e.blocks_reloaded for e in events)
    assert last.offloaded_bytes == last.blocks_total * 2 * page_bytes


@pytest.mark.parametrize("repr_kind", ["centroid", "attended"])
def test_retrieval_picks_the_block_aligned_with_the_query(loaded, repr_kind):
    eng = engine(loaded, **INFLLM, infllm_topk_blocks=1, infllm_repr=repr_kind)
    memory = eng.runner.infllm
    g = torch.Generator().manual_seed(0)
    layers, r, hkv, d = 2, memory.repr_tokens, 2, 8
    query = torch.randn(hkv, d, generator=g)
    mem = RequestMemory()
    for block in range(6):
        keys = torch.randn(layers, r, hkv, d, generator=g) * 0.1
        if block == 4:
            keys[1] += query  # layer 1's representatives of block 4 point along the query
        mem.add_summary(keys)
        mem.host_slots.append([])
    q = query.repeat_interleave(2, dim=0)[None]  # [1 token, 4 query heads (GQA 2), D]
    # Attended: a query at the scoring position itself, which re-rotation leaves unchanged.
    # Centroids are scored as they are, at any position.
    end = memory.score_position + 1
    assert memory._select(1, mem, q, end) == [4]
    assert memory._select(1, mem, -q, end) != [4]  # scores are signed: the opposite avoids it


def test_exact_retrieval_reads_every_key_from_the_host_tier(loaded):
    eng = engine(loaded, **INFLLM, infllm_topk_blocks=1, infllm_repr="exact")
    memory = eng.runner.infllm
    host = eng.kv.host.tensors[0]  # slot-major: [slots, L, 2, page, Hkv, D]
    g = torch.Generator().manual_seed(0)
    query = torch.randn(host.shape[-2], host.shape[-1], generator=g)
    mem = RequestMemory()
    for block in range(6):
        slots = [2 * block, 2 * block + 1]
        host[slots] = torch.randn(host[slots].shape, generator=g) * 0.1
        mem.host_slots.append(slots)
        mem.add_summary(torch.zeros(host.shape[1], 2, *host.shape[-2:]))  # centroids: unused
    host[9, 1, 0, 3] = 3 * query  # one key of block 4 (its second page), layer 1
    host[2, 0, 0, 1] = 3 * query  # and one of block 1, layer 0
    q = query.repeat_interleave(2, dim=0)[None]
    assert memory._select(1, mem, q, 500) == [4]
    assert memory._select(0, mem, q, 500) == [1]


def test_offloaded_pages_live_in_the_host_tier(loaded):
    eng = engine(loaded, **INFLLM, infllm_topk_blocks=2)
    rid = eng.add_request(prompt(200), SamplingParams(max_tokens=30))
    for _ in range(6):
        eng.step()
    req = eng.requests[rid]
    offloaded = req.pages.count(OFFLOADED)
    mem = eng.runner.infllm.requests[rid]
    assert offloaded == mem.num_blocks * 2 > 0
    assert eng.kv.host.num_used == offloaded
    # Every layer's cached blocks are exact copies of their host-tier pages.
    host = eng.kv.host.tensors[0]
    for layer, cache in enumerate(mem.caches):
        assert cache.lru
        for block, slot in cache.lru.items():
            pages = mem.cache_pages[slot * 2 : slot * 2 + 2]
            for page, host_slot in zip(pages, mem.host_slots[block], strict=True):
                assert torch.equal(eng.storage.data[layer, page], host[host_slot, layer])
    eng.kv.check_integrity()


def unrotated_host_keys(eng, memory, mem, block):
    """Block ``block``'s keys from the host tier, rope undone: [L, T, Hkv, D]."""
    keys = eng.kv.host.tensors[0][mem.host_slots[block], :, 0].transpose(0, 1).flatten(1, 2)
    keys = keys.float()
    first = (memory.initial_pages + block * memory.block_pages) * PAGE
    cos, sin = memory.rope.lookup(torch.arange(first, first + keys.shape[1]))
    return apply_rotary(keys, cos, -sin)


def test_centroids_are_the_mean_unrotated_keys_of_each_offloaded_page(loaded):
    eng = engine(loaded, **INFLLM, infllm_topk_blocks=2)
    memory = eng.runner.infllm
    rid = eng.add_request(prompt(200), SamplingParams(max_tokens=30))
    for _ in range(6):
        eng.step()
    mem = memory.requests[rid]
    assert mem.num_blocks >= 2 and mem.scores is None  # centroids need no attention statistics
    layers, _, _, _, kv_heads, head_dim = eng.storage.data.shape
    shape = (layers, mem.num_blocks, memory.block_pages, kv_heads, head_dim)
    assert mem.summaries.shape == shape  # one centroid per page of every block
    for block in range(mem.num_blocks):
        keys = unrotated_host_keys(eng, memory, mem, block)
        pages = keys.view(keys.shape[0], memory.block_pages, PAGE, *keys.shape[2:])
        assert mem.summaries.dtype == torch.float16
        torch.testing.assert_close(
            mem.summaries[:, block].float(), pages.mean(2), atol=2e-3, rtol=2e-3
        )
    # The request's resident bytes count the summaries as well as the pages.
    summaries = 2 * layers * mem.num_blocks * memory.block_pages * kv_heads * head_dim  # fp16
    req = eng.requests[rid]
    assert memory.resident_bytes(req) == memory.resident_pages(req) * memory.page_bytes + summaries


def test_attended_representatives_are_tokens_of_their_block(loaded):
    eng = engine(loaded, **INFLLM, infllm_topk_blocks=2, infllm_repr="attended")
    memory = eng.runner.infllm
    rid = eng.add_request(prompt(200), SamplingParams(max_tokens=30))
    for _ in range(6):
        eng.step()
    mem = memory.requests[rid]
    assert mem.num_blocks >= 2 and mem.scores is not None
    block = mem.summaries[:, 0]  # [L, r, Hkv, D], un-rotated to position 0
    assert block.shape[1] == memory.repr_tokens
    # Each representative is one of the block's stored keys, rope undone.
    unrotated = unrotated_host_keys(eng, memory, mem, 0)
    assert block.dtype == torch.float16
    dist = (block.float()[:, :, None] - unrotated[:, None]).abs().amax(-1)  # [L, r, T, Hkv]
    assert bool((dist.amin(2) < 2e-3).all())


def test_events_recorded(loaded, tmp_path):
    db = tmp_path / "run.db"
    bus = EventBus()
    eng = engine(loaded, bus, **INFLLM, infllm_topk_blocks=2)
    recorder = Recorder(db, {"test": True}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    emitted: list[InfLLMRetrieval] = []
    bus.subscribe(lambda e: emitted.append(e) if isinstance(e, InfLLMRetrieval) else None)
    eng.generate([prompt(150)], SamplingParams(max_tokens=10))
    recorder.finish("complete")
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT step, request_id, payload FROM events WHERE kind = 'infllm_retrieval' ORDER BY ts_ns"
        ).fetchall()
    assert len(rows) == len(emitted) > 0
    step, rid, payload = rows[-1]
    data = json.loads(payload)
    assert (step, rid) == (emitted[-1].step, emitted[-1].request_id)
    assert data["chosen_blocks"] == list(emitted[-1].chosen_blocks)
    assert data["resident_bytes"] == emitted[-1].resident_bytes


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(infllm_topk_blocks=0), "--infllm-topk-blocks must be >= 1"),
        (dict(infllm_block_pages=0), "--infllm-block-pages must be >= 1"),
        (dict(infllm_local_tokens=0), "--infllm-local-tokens must be >= 1"),
        (dict(kv_dtype="int8"), "infllm attention needs a float KV dtype"),
        (dict(preemption="swap"), "does not support --preemption swap"),
    ],
)
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(KvscopeError, match=message):
        EngineConfig(**(INFLLM | overrides))


def test_unknown_attention_mode_is_refused():
    with pytest.raises(KvscopeError, match="attention mode must be one of full, infllm"):
        EngineConfig(attention_mode="sparse")
