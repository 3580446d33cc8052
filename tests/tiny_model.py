"""A tiny random Llama (2 layers, hidden 32) that runs the real engine in milliseconds.

Scheduler, prefix-cache and preemption properties need hundreds of engine
steps; with this model they are cheap, and every code path is the real one.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from engine.loader import LoadedModel
from engine.model_config import ModelConfig
from engine.tokenizer import TextCodec

VOCAB = 64


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
