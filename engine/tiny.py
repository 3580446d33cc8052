"""A tiny random Llama (2 layers, hidden 32) that runs the real engine in milliseconds.

Scheduler, prefix-cache and preemption properties need hundreds of engine
steps, and the benchmarks of host-side costs need a forward that costs nearly
nothing; with this model both are cheap, and every code path is the real one.
It lives in the package (not in tests/) because the test suite and bench/
share it, and both import only the installed ``kvscope``.

``fill_cache`` and ``shared_stem_workload`` are the scale set-up of
tests/test_scale.py and bench/radix_scale.py: a pool filled to the brim with
cached chains, and a workload that must evict from it.
"""

from __future__ import annotations

import functools
import random

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import EventBus
from kvscope.engine.loaded_model import LoadedModel
from kvscope.engine.model_config import ModelConfig
from kvscope.engine.tokenizer import TextCodec

VOCAB = 64
# K+V x 2 KV heads x head_dim 8 x 2 layers x fp32: the KV bytes of one token.
BYTES_PER_TOKEN = 2 * 2 * 8 * 2 * 4


def tiny_loaded(seed: int = 0, max_position: int = 512) -> LoadedModel:
    config = ModelConfig(
        architecture="llama",
        num_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=8,
        vocab_size=VOCAB,
        rope_theta=10000.0,
        max_position=max_position,
        tie_embeddings=True,
        name="tiny",
    )
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.5

    w = {"model.embed_tokens.weight": rand(VOCAB, 32), "model.norm.weight": torch.ones(32)}
    for i in range(2):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rand(32, 32)
        w[p + "self_attn.k_proj.weight"] = rand(16, 32)
        w[p + "self_attn.v_proj.weight"] = rand(16, 32)
        w[p + "self_attn.o_proj.weight"] = rand(32, 32)
        w[p + "mlp.gate_proj.weight"] = rand(64, 32)
        w[p + "mlp.up_proj.weight"] = rand(64, 32)
        w[p + "mlp.down_proj.weight"] = rand(32, 64)
        w[p + "input_layernorm.weight"] = torch.ones(32)
        w[p + "post_attention_layernorm.weight"] = torch.ones(32)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return LoadedModel(config, w, TextCodec(tok, eos_token_ids=[]), "tiny")


@functools.cache
def shared_tiny() -> LoadedModel:
    """One tiny model for every engine that does not ask for its own (weights are read-only)."""
    return tiny_loaded()


def tiny_engine(
    pages: int,
    page_size: int = 4,
    bus: EventBus | None = None,
    loaded: LoadedModel | None = None,
    **config,
) -> Engine:
    """An engine on the tiny model whose KV budget holds exactly ``pages`` pages."""
    budget = pages * page_size * BYTES_PER_TOKEN
    engine_config = EngineConfig(kv_budget_bytes=budget, page_size=page_size, **config)
    return Engine(engine_config, bus=bus, loaded=loaded or shared_tiny())


def fill_cache(engine: Engine, slack: int = 40, chain: int = 50) -> int:
    """Fill the pool with cache-only chains of ``chain`` pages, leaving ``slack`` pages free
    (keys start with token 0, which ``shared_stem_workload`` never uses, so they are never
    hit); returns the pages filled."""
    cache, pool = engine.kv.prefix, engine.kv.pool
    page = engine.kv.page_size
    rng = random.Random(7)
    filled = 0
    index = 0
    while pool.num_free - slack > 0:
        n = min(chain, pool.num_free - slack)
        head = [0, 1 + index % 63, 1 + index // 63 % 63, 1 + index // 3969]
        tokens = head + [rng.randint(1, VOCAB - 1) for _ in range((n - 1) * page)]
        pages = pool.allocate(n)
        cache.insert(tokens, pages)
        cache.release(pages)
        filled += n
        index += 1
    return filled


def shared_stem_workload(seed: int = 3) -> list[tuple[int, list[int], int]]:
    """24 requests (arrival step, prompt, output tokens) whose prompts share a 24-token stem."""
    rng = random.Random(seed)
    stem = [rng.randint(1, VOCAB - 1) for _ in range(24)]
    return [
        (
            rng.randint(0, 12),
            stem + [rng.randint(1, VOCAB - 1) for _ in range(rng.randint(1, 20))],
            rng.randint(4, 16),
        )
        for _ in range(24)
    ]
