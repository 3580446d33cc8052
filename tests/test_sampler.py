"""Token selection: greedy rows are the argmax, drawn rows follow their own seed whatever
else is in the batch, and top-k / top-p cut where they should."""

from __future__ import annotations

import torch

from kvscope.engine.sampler import SamplingParams, sample


def _logits(rows: int = 5, vocab: int = 50) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)) * 3


def test_greedy_rows_are_the_argmax():
    logits = _logits()
    assert sample(logits, [SamplingParams()] * 5, [None] * 5) == logits.argmax(-1).tolist()
    top_k_one = SamplingParams(temperature=1.0, top_k=1)  # greedy too
    assert sample(logits, [top_k_one] * 5, [None] * 5) == logits.argmax(-1).tolist()


def test_a_drawn_row_depends_on_its_seed_only():
    logits = _logits()
    drawn = SamplingParams(temperature=0.8, top_p=0.9, seed=7)

    def gen() -> torch.Generator:
        return torch.Generator().manual_seed(7)

    alone = sample(logits[3:4], [drawn], [gen()])
    params = [SamplingParams(), drawn, SamplingParams(temperature=1.3, seed=2), SamplingParams()]
    mixed = sample(
        logits[[0, 3, 1, 2]], params, [None, gen(), torch.Generator().manual_seed(2), None]
    )
    assert mixed[1] == alone[0]
    assert mixed[0] == logits[0].argmax().item() and mixed[3] == logits[2].argmax().item()
    draws = {tuple(sample(logits[3:4], [drawn], [gen()])) for _ in range(5)}
    assert draws == {tuple(alone)}  # the same seed, the same token


def test_top_k_and_top_p_keep_only_the_best_tokens():
    logits = _logits(rows=1, vocab=50)
    best3 = set(logits[0].topk(3).indices.tolist())
    params = SamplingParams(temperature=5.0, top_k=3)
    g = torch.Generator().manual_seed(0)
    assert {sample(logits, [params], [g])[0] for _ in range(60)} <= best3
    tiny_p = SamplingParams(temperature=5.0, top_p=1e-6)
    assert sample(logits, [tiny_p], [g]) == [logits[0].argmax().item()]
