"""Decode-graph buckets and padding, checked on the CPU: the graph path runs the same
forward on the same static buffers (only the capture itself needs CUDA)."""

from __future__ import annotations

import math

import pytest

from engine.cuda_graphs import DecodeBatch, bucket_for, decode_buckets, pad_decode
from engine.engine import Engine
from engine.engine_config import EngineConfig
from engine.sampler import SamplingParams
from tests.tiny_model import tiny_loaded


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


def test_padding_rows_touch_only_the_scratch_page():
    batch = DecodeBatch([5, 6], [17, 3], [7 * 16 + 1, 2 * 16 + 3], [[4, 7], [2]], [18, 4], 2)
    padded = pad_decode(batch, 4, pad_page=99, page_size=16)
    assert padded.size == 4 and padded.num_real == 2
    assert padded.token_ids == [5, 6, 0, 0] and padded.positions == [17, 3, 0, 0]
    assert padded.slots[2:] == [99 * 16] * 2
    assert padded.page_tables[2:] == [[99], [99]] and padded.kv_lens[2:] == [1, 1]
    assert batch.size == 2  # the input is not modified
    with pytest.raises(AssertionError):
        pad_decode(padded, 2, 99, 16)


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
