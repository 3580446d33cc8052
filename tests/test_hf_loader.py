"""Hugging Face directories (config.json + safetensors) load through our loader and give the same logits.

A tiny random Llama and a tiny Qwen2 (q/k/v biases) are made with transformers
in a temp dir; our engine's logits, computed through the paged cache, must
equal transformers' forward on the same weights.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import ModelLoadError
from kvscope.engine.loader import load_model


def _save_tokenizer(path, vocab_size: int) -> None:
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w1"}))


def _tiny(kind: str, path):
    import transformers

    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
        with torch.no_grad():  # make the q/k/v biases matter
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    _save_tokenizer(path, 96)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_hf_dir_logits_match(kind, tmp_path):
    ref = _tiny(kind, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.architecture == kind and loaded.config.qkv_bias == (kind == "qwen2")
    engine = Engine(EngineConfig(kv_budget_bytes=1 << 20, page_size=4), loaded=loaded)
    ids = torch.randint(2, 96, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    ours = engine.score(ids, chunk=10)
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    # generation_config.json names the EOS id when it has one; otherwise tokenizer_config's eos_token
    expected_eos = ref.generation_config.eos_token_id
    assert engine.codec.eos_token_ids == [1 if expected_eos is None else expected_eos]


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        load_model(tmp_path)


GOOD_SHAPE = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 128,
              "vocab_size": 100}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_hidden_layers", 2.5), ("num_hidden_layers", True), ("num_attention_heads", 0),
     ("hidden_size", "64"), ("vocab_size", -1), ("head_dim", 1.5),
     ("max_position_embeddings", "x")],
)  # fmt: skip
def test_a_size_that_is_no_whole_number_is_named(tmp_path, field, value):
    """2.5 or true had been taken as 2 or 1, and 0 heads had been 'integer division or
    modulo by zero'; the field and its value are named instead."""
    from kvscope.engine.model_config import ModelConfig

    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD_SHAPE))
    assert ModelConfig.from_hf_config(path).head_dim == 16
    path.write_text(json.dumps(GOOD_SHAPE | {field: value}))
    with pytest.raises(ModelLoadError, match=f"{field} must be a whole number >= 1, got"):
        ModelConfig.from_hf_config(path)
    path.write_text(json.dumps({k: v for k, v in GOOD_SHAPE.items() if k != "model_type"}))
    with pytest.raises(ModelLoadError, match="has no 'model_type'"):
        ModelConfig.from_hf_config(path)
