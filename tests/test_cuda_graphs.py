"""Decode-graph buckets and padding, checked on the CPU: the graph path runs the same
forward on the same static buffers (only the capture itself needs CUDA)."""

from __future__ import annotations

import math

import pytest
import torch

from kvscope.engine.cuda_graphs import DecodeGraphs, bucket_for, decode_buckets
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.runner import prefill_warmup_lengths
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import tiny_loaded


def test_buckets_follow_nano_vllm_and_end_at_max_num_seqs():
    assert decode_buckets(1) == [1]
    assert decode_buckets(6) == [1, 2, 4, 6]
    assert decode_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert decode_buckets(40) == [1, 2, 4, 8, 16, 32, 40]


@pytest.mark.parametrize(
    "n, bucket", [(1, 1), (3, 4), (8, 8), (9, 16), (33, 48), (64, 64), (65, None)]
)
def test_a_batch_runs_in_the_smallest_bucket_that_holds_it(n, bucket):
    assert bucket_for(n, decode_buckets(64)) == bucket


def _graphs(max_num_seqs: int = 4, max_pages: int = 3, page_size: int = 16) -> DecodeGraphs:
    return DecodeGraphs(lambda *a: None, max_num_seqs, max_pages, page_size, "cpu")


def test_padding_rows_touch_only_the_scratch_page():
    graphs = _graphs()
    # Three real rows: pages [4, 7] at position 17, [2] at position 3, [9] at position 0.
    batch = graphs.stage(
        [5, 6, 8], [17, 3, 0], [7 * 16 + 1, 2 * 16 + 3, 9 * 16], [4, 7, 2, 9], [0, 2, 3, 4],
        [2, 4, 1], [18, 4, 1], True, pad_page=99,
    )  # fmt: skip
    assert (batch.size, batch.num_real, batch.kv_lens) == (4, 3, [18, 4, 1, 1])
    assert graphs.token_ids.tolist() == [5, 6, 8, 0]
    assert graphs.positions.tolist() == [17, 3, 0, 0]
    assert graphs.slots.tolist() == [7 * 16 + 1, 2 * 16 + 3, 9 * 16, 99 * 16]
    assert graphs.kv_indptr.tolist() == [0, 2, 3, 4, 5]
    assert graphs.kv_indices[:5].tolist() == [4, 7, 2, 9, 99]
    assert graphs.kv_last_page_len.tolist() == [2, 4, 1, 1]
    meta = graphs.meta(4, None)  # captured: the longest context sizes the split-K launch
    assert meta.kv_lens == [48] * 4 and meta.query_lens == [1] * 4
    with pytest.raises(AssertionError):
        graphs.stage([1] * 5, [0] * 5, [0] * 5, [0] * 5, range(6), [1] * 5, [1] * 5, True, 99)


def test_the_warm_up_times_real_contexts_not_one_token():
    graphs = _graphs(max_pages=8)
    kv_lens = graphs.stage_warmup(4, num_pages=5, pad_page=5, kv_len=100)
    assert kv_lens == [100] * 4  # 7 pages each, the last holding 4 tokens
    assert graphs.kv_indptr.tolist() == [0, 7, 14, 21, 28]
    assert graphs.kv_last_page_len.tolist() == [4] * 4
    assert set(graphs.kv_indices[:28].tolist()) == set(range(5))  # existing pages, read only
    assert graphs.slots.tolist() == [5 * 16] * 4 and graphs.positions.tolist() == [99] * 4
    assert graphs.stage_warmup(2, 5, 5, kv_len=10_000) == [8 * 16] * 2  # capped at the longest


def _engine(max_num_seqs: int) -> Engine:
    config = EngineConfig(kv_budget_bytes=64 * 16 * 2 * 2 * 2 * 8 * 4, max_num_seqs=max_num_seqs)
    return Engine(config, loaded=tiny_loaded())


def test_greedy_tokens_are_identical_through_the_padded_graph_path():
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], [3] * 20, [11, 12], [40, 41, 42, 43, 44, 45, 46]]
    params = [SamplingParams(max_tokens=m) for m in (6, 14, 9, 3, 11)]

    def run(engine: Engine) -> list[list[int]]:
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        final = {o.request_id: o.token_ids for o in engine.stream() if o.finished}
        return [final[i] for i in ids]

    eager = run(_engine(8))
    graphed = _engine(8)
    pages_per_seq = math.ceil(graphed.max_request_tokens / graphed.config.page_size)
    # On CUDA the scratch page lies past the pool; here one page taken from the pool serves.
    [scratch] = graphed.kv.pool.allocate(1)
    graphed.runner.capture_decode_graphs(8, pages_per_seq, pad_page=scratch)
    buckets: list[int] = []
    replay = graphed.runner.graphs.run
    graphed.runner.graphs.run = lambda b: buckets.append(b.size) or replay(b)
    assert run(graphed) == eager
    # 5 requests pad to 8, then to 4 and 2 as they finish; never a partial bucket.
    assert {8, 4, 2} <= set(buckets) <= set(decode_buckets(8))


def test_score_with_graphs_routes_one_token_chunks_through_the_graph_path():
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    eager = _engine(4).score(seq, chunk=1)
    graphed = _engine(4)
    pages_per_seq = math.ceil(graphed.max_request_tokens / graphed.config.page_size)
    [scratch] = graphed.kv.pool.allocate(1)
    graphed.runner.capture_decode_graphs(4, pages_per_seq, pad_page=scratch)
    runs = []
    replay = graphed.runner.graphs.run
    graphed.runner.graphs.run = lambda b: runs.append(b.size) or replay(b)
    got = graphed.score(seq, chunk=1)
    assert runs == [1] * len(seq)  # every 1-token chunk went to the graph path
    assert got.shape == eager.shape == (len(seq), 64)
    assert torch.allclose(got, eager, atol=1e-5)
    mixed = graphed.score(seq, chunk=7)  # 7, 7, 6 tokens: eager; the same logits
    assert torch.allclose(mixed, eager, atol=1e-4)


def test_prefill_warm_up_covers_every_query_length_class():
    assert prefill_warmup_lengths(2048, 10**6) == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    assert prefill_warmup_lengths(100, 10**6) == [2, 4, 8, 16, 32, 64, 100]
    assert prefill_warmup_lengths(8192, 48) == [2, 4, 8, 16, 32, 48]  # a small pool caps it
    assert prefill_warmup_lengths(1, 48) == []


def test_the_warm_up_prefills_leave_no_trace_in_what_the_engine_computes():
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7] * 7]
    params = SamplingParams(max_tokens=6)
    fresh = [o.token_ids for o in _engine(4).generate(prompts, params)]
    warmed = _engine(4)
    free = warmed.kv.pool.num_free
    warmed.runner.run_prefills(prefill_warmup_lengths(64, 1024))
    assert warmed.kv.pool.num_free == free  # stand-ins, not requests: no page is taken
    assert [o.token_ids for o in warmed.generate(prompts, params)] == fresh
