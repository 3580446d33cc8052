"""Sizing math and presets: the figures ``kvscope calc`` is built on (GiB = 2**30)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kvscope.engine.errors import KvscopeError
from kvscope.engine.presets import DEVICES, MODELS, device_preset, model_preset
from kvscope.engine.sizing import (
    GIB,
    MIB,
    ContextShape,
    MemoryBudget,
    ModelShape,
    Residency,
    avg_tokens_held,
    batch_at_context,
    cliff_context,
    compute_bound_batch,
    kv_bytes_per_token,
    kv_capacity,
    reload_cost,
    weight_bytes,
)

LLAMA3_8B = ModelShape.from_config(MODELS["llama3-8b"])


def test_llama3_8b_on_80_gib_with_16_gib_weights_and_no_overhead():
    per_token = LLAMA3_8B.bytes_per_token("fp16")
    assert per_token == 131_072 == 128 * 1024
    avg = avg_tokens_held(1024, 1024)
    assert avg == 1536
    budget = MemoryBudget(80 * GIB, 16 * GIB, overhead_bytes=0)
    assert budget.kv_bytes == 64 * GIB
    cap = kv_capacity(budget.kv_bytes, per_token, avg, max_model_len=3072)
    assert cap.kv_bytes_per_request == 192 * MIB
    assert cap.max_avg_batch == 341
    assert cap.tokens_in_budget == 512 * 1024
    assert cap.max_batch_max_reservation == 170
    mha = LLAMA3_8B.kv_head_variants()["MHA"]
    assert kv_capacity(budget.kv_bytes, mha.bytes_per_token(), avg, 3072).max_avg_batch == 85


@pytest.mark.parametrize("overhead_gib, kv_gib", [(1, 63), (1.5, 62.5), (2, 62)])
def test_framework_overhead_takes_one_to_two_gib_from_the_kv_budget(overhead_gib, kv_gib):
    budget = MemoryBudget(80 * GIB, 16 * GIB, overhead_bytes=overhead_gib * GIB)
    assert budget.kv_bytes == kv_gib * GIB


def test_budget_is_zero_not_negative_when_weights_do_not_fit():
    budget = MemoryBudget(24 * GIB, weight_bytes(MODELS["llama3-70b"].num_params))
    assert budget.spare_bytes < 0
    assert budget.kv_bytes == 0
    assert kv_capacity(budget.kv_bytes, 131_072, 1536, 8192).max_avg_batch == 0


def test_70b_class_mha_shape_holds_160_gib_for_16_sequences_of_4096_tokens():
    assert kv_bytes_per_token(80, 64, 128, "fp16") * 4096 * 16 == 160 * GIB


def test_kv_head_variants_are_mha_gqa_mqa():
    variants = LLAMA3_8B.kv_head_variants()
    assert {k: v.kv_heads for k, v in variants.items()} == {"MHA": 32, "GQA": 8, "MQA": 1}
    assert variants["MQA"].bytes_per_token() == 131_072 / 8


def test_quantized_kv_pays_for_its_scales():
    # int8: 128 payload bytes + one fp32 scale per head vector; int4: 64 + 4 groups x 4 bytes
    assert LLAMA3_8B.bytes_per_token("int8") == 2 * 8 * 32 * 132
    assert LLAMA3_8B.bytes_per_token("int4") == 2 * 8 * 32 * 80
    assert LLAMA3_8B.bytes_per_token("fp8_e4m3") == 65_536


def test_weights_are_2p_p_and_half_p_bytes():
    assert weight_bytes(8_000, "fp16") == weight_bytes(8_000, "bf16") == 16_000
    assert weight_bytes(8_000, "int8") == 8_000
    assert weight_bytes(8_000, "int4") == 4_000
    with pytest.raises(KvscopeError, match="weight dtype"):
        weight_bytes(8_000, "fp12")


def test_reloading_an_8b_models_kv_over_30_gbps_pcie_is_about_12x_cheaper_than_recomputing():
    per_token = kv_bytes_per_token(32, 1, 1024, "fp16")  # KV width 1024 = 8 heads x 128
    cost = reload_cost(8e9, per_token, pcie_gbps=30, tflops=300)
    assert cost.recompute_s == pytest.approx(2 * 8e9 / 300e12)
    assert cost.load_s == pytest.approx(131_072 / 30e9)
    assert cost.recompute_over_load == pytest.approx(30e9 * 8e9 / (2 * 1024 * 32 * 300e12))
    assert round(cost.recompute_over_load) == 12


@pytest.mark.parametrize(
    "name, params",
    [
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("mistral-7b", 7_241_732_096),
        ("qwen2.5-7b", 7_615_616_512),
        ("smollm2-135m", 134_515_008),
    ],
)
def test_model_presets_match_published_parameter_counts(name, params):
    assert model_preset(name).num_params == params


def test_device_lookup_ignores_case_spaces_and_dashes_and_rejects_unknown_names():
    assert device_preset("RTX 4090") is device_preset("rtx4090") is DEVICES["rtx-4090"]
    assert device_preset("H200-141").memory_gib > device_preset("h100-80").memory_gib
    assert set(DEVICES) >= {"a100-40", "a100-80", "h100-80", "h200-141", "l4", "rtx-4090", "cpu"}
    with pytest.raises(KvscopeError, match="unknown device 'b200'.*h100-80"):
        device_preset("b200")
    with pytest.raises(KvscopeError, match="unknown model preset"):
        model_preset("gpt-5")
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEVICES["cpu"].memory_gib = 1.0


def test_explicit_shapes_are_validated():
    with pytest.raises(KvscopeError, match="do not split"):
        ModelShape("x", 32, 32, 5, 128)
    with pytest.raises(KvscopeError, match="layers must be a positive"):
        ModelShape("x", 0, 32, 8, 128)


def test_shape_from_hugging_face_config_counts_llama3_8b_parameters(tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "Meta-Llama-3-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    shape = ModelShape.from_hf_config(path)
    assert dataclasses.replace(shape, name="llama3-8b") == LLAMA3_8B


def test_shape_from_gguf_reads_metadata_and_counts_tensor_elements(tmp_path):
    import gguf

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_vocab_size(100)
    writer.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.zeros(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shape = ModelShape.from_gguf(path)
    assert (shape.layers, shape.q_heads, shape.kv_heads, shape.head_dim) == (2, 4, 2, 16)
    assert (shape.params, shape.context_len) == (100 * 64 + 64, 512)


@pytest.mark.slow
def test_the_real_smollm2_gguf_matches_its_preset():
    from kvscope.engine.loader import default_model_path

    shape = ModelShape.from_gguf(default_model_path())
    assert dataclasses.replace(shape, name="smollm2-135m") == ModelShape.from_config(
        MODELS["smollm2-135m"]
    )


@pytest.mark.parametrize(
    "nvml_name, preset",
    [
        ("NVIDIA H100 80GB HBM3", "h100-80"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200-141"),
        ("NVIDIA A100-SXM4-40GB", "a100-40"),
        ("NVIDIA A100-SXM4-80GB", "a100-80"),
        ("NVIDIA A100 80GB PCIe", "a100-80-pcie"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ],
)
def test_devices_are_found_by_the_name_nvml_reports(nvml_name, preset):
    assert device_preset(nvml_name) is DEVICES[preset]


def test_every_gpu_preset_has_an_nvml_name_and_datasheet_peaks():
    for device in DEVICES.values():
        assert device.name == "cpu" or device.nvml_names, device.name
    h100, h200 = DEVICES["h100-80"], DEVICES["h200-141"]
    assert (h100.fp16_tflops, h100.hbm_gbps) == (989, 3350)
    assert (h200.fp16_tflops, h200.hbm_gbps) == (989, 4800)


# The seed note's round H100 figures: 80 GiB, 16 GiB of weights, no overhead,
# about 1,000 TFLOP/s over 3 TB/s.
SEED_BUDGET = MemoryBudget(80 * GIB, 16 * GIB, overhead_bytes=0).kv_bytes
HALF_AND_HALF = ContextShape.of(1024, 1024)


def test_compute_bound_batch_is_flops_over_bandwidth_for_16_bit_weights():
    assert compute_bound_batch(1000, 3000) == pytest.approx(1000 / 3)
    assert compute_bound_batch(989, 3350) == pytest.approx(295.22, abs=0.01)
    # int8 weights halve the bytes read per FLOP: half the batch is compute-bound
    assert compute_bound_batch(1000, 3000, weight_bytes_per_param=1) == pytest.approx(500 / 3)


def test_seed_h100_batch_at_1024_plus_1024_and_the_cliff_just_past_it():
    per_token = LLAMA3_8B.bytes_per_token("fp16")
    assert batch_at_context(SEED_BUDGET, per_token, 2048, HALF_AND_HALF) == 341
    needed = compute_bound_batch(1000, 3000)
    cliff = cliff_context(SEED_BUDGET, per_token, needed, HALF_AND_HALF)
    # 64 GiB / 128 KiB = 524,288 tokens; 334 requests hold 0.75 L tokens each
    assert cliff == 2092
    assert batch_at_context(SEED_BUDGET, per_token, cliff, HALF_AND_HALF) == 334
    assert batch_at_context(SEED_BUDGET, per_token, cliff + 1, HALF_AND_HALF) == 333 < needed
    fp8 = cliff_context(SEED_BUDGET, LLAMA3_8B.bytes_per_token("fp8_e4m3"), needed, HALF_AND_HALF)
    assert fp8 == pytest.approx(2 * cliff, abs=2)  # half the bytes, twice the context


def test_cliff_is_zero_when_no_context_fits_the_batch_and_none_when_a_resident_cap_holds_it():
    per_token = LLAMA3_8B.bytes_per_token("fp16")
    assert cliff_context(GIB, per_token, 20_000, HALF_AND_HALF) == 0  # 8,192 tokens
    # 1,024 resident tokens each: 524,288 / 1,024 = 512 requests at any length
    capped = Residency(tokens=1024)
    assert cliff_context(SEED_BUDGET, per_token, 333.3, HALF_AND_HALF, capped) is None
    assert batch_at_context(SEED_BUDGET, per_token, 1 << 20, HALF_AND_HALF, capped) == 512
    quarter = Residency(fraction=0.25)
    assert cliff_context(SEED_BUDGET, per_token, 333.3, HALF_AND_HALF, quarter) == pytest.approx(
        4 * 2092, abs=4
    )


def test_avg_resident_tokens_rise_with_the_context_then_stay_at_the_cap():
    assert avg_tokens_held(1024, 1024, Residency(tokens=4096)) == 1536  # cap never reached
    assert avg_tokens_held(1024, 1024, Residency(tokens=512)) == 512  # reached during prefill
    # cap 1,536: decode rises from 1,024 to 1,536 over 512 tokens (mean 1,280), then holds
    assert avg_tokens_held(1024, 1024, Residency(tokens=1536)) == (512 * 1280 + 512 * 1536) / 1024
    assert avg_tokens_held(1024, 1024, Residency(fraction=0.5)) == 768
    assert avg_tokens_held(1024, 1024, Residency(tokens=512, fraction=0.25)) == 384
    with pytest.raises(KvscopeError, match="resident fraction"):
        Residency(fraction=1.5)
