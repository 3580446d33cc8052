"""Dummy weights: real shapes, seeded random values, a byte-level tokenizer, EOS ignored;
and the memory budget the engine measures and records for them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvscope.engine.dummy import byte_codec, dummy_config, dummy_weights, load_dummy
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import KvscopeError, ModelLoadError
from kvscope.engine.events import EventBus, MemoryBudgetMeasured
from kvscope.engine.loader import LoadedModel, load_model
from kvscope.engine.memory_budget import estimate_activation_bytes
from kvscope.engine.model_config import ModelConfig
from kvscope.engine.presets import model_preset
from kvscope.engine.sampler import SamplingParams

TINY = ModelConfig(
    architecture="qwen2",
    num_layers=2,
    hidden_size=32,
    intermediate_size=64,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=8,
    vocab_size=200,  # below the byte codec's 259 ids: exercises the clipping
    max_position=256,
    qkv_bias=True,
    name="tiny-qwen",
)


def tiny_dummy(seed: int = 0) -> LoadedModel:
    weights = dummy_weights(TINY, seed=seed)
    return LoadedModel(TINY, weights, byte_codec(TINY.vocab_size), "dummy:tiny")


def test_weights_have_every_tensor_of_the_shape_and_count_its_parameters():
    config = model_preset("qwen2.5-7b")
    small = dataclasses.replace(config, num_layers=1, vocab_size=64)
    w = dummy_weights(small, dtype=torch.bfloat16)
    assert sum(t.numel() for t in w.values()) == small.num_params
    assert w["model.layers.0.self_attn.q_proj.bias"].shape == (28 * 128,)
    assert w["model.layers.0.mlp.gate_proj.weight"].shape == (18944, 3584)
    assert "lm_head.weight" in w and all(t.dtype == torch.bfloat16 for t in w.values())
    assert torch.equal(w["model.norm.weight"], torch.ones(3584, dtype=torch.bfloat16))
    std = w["model.layers.0.mlp.down_proj.weight"].float().std().item()
    assert std == pytest.approx(0.02, rel=0.02)


def test_weights_are_seeded():
    a, b, c = dummy_weights(TINY, seed=1), dummy_weights(TINY, seed=1), dummy_weights(TINY, seed=2)
    name = "model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(a[name], b[name])
    assert not torch.equal(a[name], c[name])


def test_model_names_resolve_to_shapes_and_bad_ones_are_refused(tmp_path):
    assert dummy_config("preset:llama3-8b") is model_preset("llama3-8b")
    assert dummy_config(None).name == "smollm2-135m"
    with pytest.raises(KvscopeError, match="unknown model preset 'gpt5'"):
        dummy_config("preset:gpt5")
    with pytest.raises(ModelLoadError, match="needs preset:NAME or a Hugging Face directory"):
        dummy_config(str(tmp_path / "x.gguf"))
    with pytest.raises(ModelLoadError, match="add --load-format dummy"):
        load_model("preset:llama3-8b")


def test_byte_codec_round_trips_text_and_renders_chat():
    codec = byte_codec(50_000)
    text = "KV caches: 16 pages, naïve ✓"
    ids = codec.encode(text)
    assert len(ids) == len(text.encode()) and max(ids) < 256
    assert codec.decode(ids) == text
    chat = codec.encode(codec.render_chat([{"role": "user", "content": "hi"}]))
    assert chat[0] == codec.tokenizer.token_to_id("<|im_start|>") == 256
    assert codec.eos_token_ids == []  # dummy runs ignore EOS
    assert max(byte_codec(200).encode("\xff\xfe ~")) == 199


def test_dummy_engine_runs_to_the_requested_lengths():
    engine = Engine(EngineConfig(kv_budget_bytes=1 << 20), loaded=tiny_dummy())
    params = SamplingParams(max_tokens=12)
    outs = engine.generate(["hello dummy", "a longer prompt about pages", "x"], params)
    assert [len(o.token_ids) for o in outs] == [12, 12, 12]
    assert {o.finish_reason for o in outs} == {"length"}
    again = Engine(EngineConfig(kv_budget_bytes=1 << 20), loaded=tiny_dummy())
    assert [o.token_ids for o in again.generate(["hello dummy"], params)] == [outs[0].token_ids]


def test_smollm2_dummy_builds_from_the_preset_in_bf16():
    engine = Engine(
        EngineConfig(
            model="preset:smollm2-135m",
            load_format="dummy",
            weights_dtype="bf16",
            kv_budget_bytes=8 << 20,
        )
    )
    assert engine.loaded.source == "dummy:smollm2-135m"
    assert engine.model.layers[0].qkv.weight.dtype == torch.bfloat16
    assert engine.model.layers[0].qkv.weight.shape == (9 * 64 + 2 * 3 * 64, 576)
    out = engine.generate(["The KV cache"], SamplingParams(max_tokens=5))[0]
    assert len(out.token_ids) == 5 and all(0 <= t < 49152 for t in out.token_ids)
    # The engine dropped its draw; an engine sharing the model draws the same weights.
    assert engine.loaded.weights == {}
    twin = Engine(engine.config, loaded=engine.loaded)
    assert (
        twin.generate(["The KV cache"], SamplingParams(max_tokens=5))[0].token_ids == out.token_ids
    )
    direct = load_dummy("preset:smollm2-135m", "bf16")
    assert direct.weights["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_memory_budget_terms_are_measured_recorded_and_sized_from():
    bus = EventBus()
    seen: list = []
    bus.subscribe(seen.append)
    # A fraction that leaves about 32 MiB for pages once this process's memory is counted.
    probe = Engine(EngineConfig(kv_budget_bytes=1 << 20), loaded=tiny_dummy()).budget
    spent = probe.weights_bytes + probe.activation_bytes + probe.overhead_bytes
    fraction = (spent + (32 << 20)) / probe.device_bytes
    config = EngineConfig(kv_budget_bytes=None, memory_fraction=fraction, max_batched_tokens=64)
    engine = Engine(config, bus=bus, loaded=tiny_dummy())
    b = engine.budget
    assert b.device == "cpu" and not b.activations_measured and b.overhead_measured
    assert b.weights_bytes == engine.model.weight_bytes
    assert b.activation_bytes == estimate_activation_bytes(TINY, 64, config.max_num_seqs)
    assert b.overhead_bytes > 50 << 20  # the interpreter, torch and the tokenizer, at least
    assert (
        engine.kv_budget_bytes
        == b.kv_bytes
        == int(b.device_bytes * fraction - b.weights_bytes - b.activation_bytes - b.overhead_bytes)
    )
    assert 16 << 20 < b.kv_bytes < 48 << 20
    engine.generate(["hi"], SamplingParams(max_tokens=2))
    [event] = [e for e in seen if isinstance(e, MemoryBudgetMeasured)]
    assert event.step == 0 and event.weights_bytes == b.weights_bytes
    assert event.kv_bytes == engine.storage.nbytes
    # calc's prediction: the same usable memory less fp32 weights and its 1.5 GiB overhead.
    assert event.predicted_kv_bytes == max(
        0, int(b.device_bytes * fraction - TINY.num_params * 4 - 1.5 * 2**30)
    )


def test_a_budget_that_leaves_nothing_for_the_kv_cache_is_a_clear_error():
    config = EngineConfig(kv_budget_bytes=None, memory_fraction=1e-6)
    with pytest.raises(KvscopeError, match="no memory left for the KV cache"):
        Engine(config, loaded=tiny_dummy())


@pytest.mark.parametrize("weights_dtype", ["fp32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("tied", [True, False])
def test_stored_weight_bytes_are_what_the_built_model_holds(weights_dtype, tied):
    """``info`` counts a dummy model's bytes from its shape; they must be the built model's."""
    from kvscope.engine.dummy import stored_weight_bytes
    from kvscope.engine.model import DecoderModel

    config = dataclasses.replace(TINY, tie_embeddings=tied)
    model = DecoderModel(config, dummy_weights(config), weights_dtype, "cpu")
    assert stored_weight_bytes(config, weights_dtype, "cpu") == model.weight_bytes


def test_int4_refuses_out_features_its_packing_cannot_hold():
    """torch packs int4 rows in sixteens: a fused q/k/v of 40 rows (8 heads of 4, one kv
    head) had raised a bare RuntimeError from the packing, and ``info`` had counted it."""
    from kvscope.engine.dummy import stored_weight_bytes
    from kvscope.engine.model import DecoderModel

    config = dataclasses.replace(TINY, num_q_heads=8, num_kv_heads=1, head_dim=4)
    message = "int4 weights need out-features divisible by 16, got 40"
    with pytest.raises(ModelLoadError, match=message):
        DecoderModel(config, dummy_weights(config), "int4", "cpu")
    with pytest.raises(ModelLoadError, match=message):
        stored_weight_bytes(config, "int4", "cpu")
    assert stored_weight_bytes(config, "int8", "cpu") > 0  # only int4 packs in sixteens


@pytest.mark.parametrize("weights_dtype", ["fp32", "bf16"])
def test_info_on_dummy_weights_prints_what_the_built_engine_would(weights_dtype):
    from kvscope.app.cli import build_parser
    from kvscope.app.commands.info import _from_engine, _from_shape
    from kvscope.app.engine_options import engine_config_from_args

    argv = ["info", "--model", "preset:smollm2-135m", "--load-format", "dummy"]
    args = build_parser().parse_args([*argv, "--weights-dtype", weights_dtype])
    config = engine_config_from_args(args)
    assert _from_shape(config) == _from_engine(config)


def test_info_describes_a_large_dummy_model_without_drawing_it(capsys):
    """Info had built the engine: 8B random weights drawn (16 GB in bf16) for over a
    minute on the CPU, to print a shape. int4 keeps the memory check below small machines'."""
    import json
    import time

    from kvscope.app.cli import main

    started = time.monotonic()
    argv = ["info", "--model", "preset:llama3-8b", "--load-format", "dummy", "--device", "cpu"]
    assert main([*argv, "--weights-dtype", "int4", "--json"]) == 0
    out, err = capsys.readouterr()
    assert time.monotonic() - started < 20  # the draw alone had taken over a minute
    assert "loading model" not in err  # nothing was loaded, or drawn
    info = json.loads(out)
    assert info["model"] == "dummy:llama3-8b" and info["params"] == 8_030_261_248
    # int4 projections (half a byte a weight, and their scales), an int8 head, bf16 embeddings.
    assert 0.5 * info["params"] < info["weight_bytes"] < 0.8 * info["params"]
    assert info["kv_bytes_per_token"] == 2 * 8 * 128 * 32 * 4  # fp32 KV
    assert info["pages"] == (24 << 20) // (16 * info["kv_bytes_per_token"]) == 6
