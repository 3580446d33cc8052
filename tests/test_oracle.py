"""The engine's greedy output equals transformers' on the same GGUF weights.

Eight prompts of different lengths (plain and chat) run together in one
continuous batch; each generated token must be the reference model's argmax
after the prompt and the tokens before it (teacher forcing: equal argmax at
every position is equivalent to equal greedy output, and costs one forward
per prompt instead of 48). One prompt is also checked against
``transformers.generate`` end to end.
"""

from __future__ import annotations

import pytest
import torch

from kvscope.engine.sampler import SamplingParams

from support.prompts import CHAT, PLAIN

pytestmark = pytest.mark.slow

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def batch_outputs(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in PLAIN]
    ids += [engine.add_request(p, params, chat=True) for p in CHAT]
    done = {}
    for out in engine.stream():
        if out.finished:
            done[out.request_id] = out
    return [(engine.requests[i].prompt_ids, done[i].token_ids) for i in ids]


def test_batch_greedy_matches_transformers(batch_outputs, oracle):
    assert len({len(p) for p, _ in batch_outputs}) >= 6, "prompts should have different lengths"
    for prompt_ids, generated in batch_outputs:
        assert len(generated) == NEW_TOKENS
        full = torch.tensor([prompt_ids + generated[:-1]])
        with torch.no_grad():
            logits = oracle(full).logits[0, len(prompt_ids) - 1 :]
        expected = logits.argmax(-1).tolist()
        assert generated == expected


def test_prefill_logits_agree(make_engine, oracle, loaded):
    engine = make_engine()
    ids = loaded.codec.encode(loaded.codec.render_chat([{"role": "user", "content": CHAT[2]}]))
    ours = engine.score(ids, chunk=7)  # several chunks: the cache is read back between them
    with torch.no_grad():
        ref = oracle(torch.tensor([ids])).logits[0]
    scale = ref.abs().max().item()
    assert (ours - ref).abs().max().item() < 1e-3 * scale
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_generate_end_to_end_matches(make_engine, oracle):
    engine = make_engine()
    [out] = engine.generate([PLAIN[2]], SamplingParams(max_tokens=24, ignore_eos=True))
    prompt_ids = engine.requests[out.request_id].prompt_ids
    ref = oracle.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=2,
    )
    assert out.token_ids == ref[0, len(prompt_ids) :].tolist()


def test_batch_invariance(make_engine, batch_outputs):
    """A prompt's greedy output is the same alone as inside the batch."""
    engine = make_engine()
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    for index in (0, 5):
        prompt_ids, in_batch = batch_outputs[index]
        [alone] = engine.generate([prompt_ids], params)
        assert alone.token_ids == in_batch
