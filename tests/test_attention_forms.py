"""Sizing models whose layers are not all full attention: every new preset's bytes per
token and per request equal a hand computation from its published config, shown
here beside the config values; and ``calc`` and ``calc cliff`` count per group."""

from __future__ import annotations

import json

import pytest

from kvscope.engine.attention_forms import LayerGroup
from kvscope.engine.attention_presets import (
    SIZING_PRESETS,
    gated_delta_net_state,
    sizing_preset,
)
from kvscope.engine.errors import KvscopeError
from kvscope.engine.sizing import ContextShape, ModelShape, shape_batch_at_context

from support.cli_runs import one_error, run_cli

FP16 = 2  # bytes an element
L = 32_768  # a long context: windows saturated, full layers growing


def kv_per_layer(kv_heads: int, head_dim: int, element: int = FP16) -> int:
    """K and V of one token in one layer."""
    return 2 * kv_heads * head_dim * element


# (preset, bytes per token over every group, bytes one request of L tokens holds),
# each from the config values in the comment.
HAND = {
    # 36 layers alternating sliding (window 128) / full; 8 KV heads x head_dim 64
    "gpt-oss-120b": (36 * kv_per_layer(8, 64), 18 * kv_per_layer(8, 64) * (L + 128)),
    # 24 layers, the same alternation and heads
    "gpt-oss-20b": (24 * kv_per_layer(8, 64), 12 * kv_per_layer(8, 64) * (L + 128)),
    # 62 layers, every 6th full (10), the others sliding 1024; 16 KV heads x 128
    "gemma-3-27b": (
        62 * kv_per_layer(16, 128),
        kv_per_layer(16, 128) * (10 * L + 52 * 1024),
    ),
    # 40 full layers, 8 KV heads x 128 (sliding_window null)
    "mistral-small-3.1": (40 * kv_per_layer(8, 128), 40 * kv_per_layer(8, 128) * L),
    # 48 layers, every 4th full (12), the others chunked 8192; 8 KV heads x 128
    "llama-4-scout": (
        48 * kv_per_layer(8, 128),
        kv_per_layer(8, 128) * (12 * L + 36 * 8192),
    ),
    # 61 MLA layers: one latent of kv_lora_rank 512 + qk_rope_head_dim 64
    "deepseek-v3": (61 * 576 * FP16, 61 * 576 * FP16 * L),
    "kimi-k2": (61 * 576 * FP16, 61 * 576 * FP16 * L),
    # 48 layers, every 4th full (12: 2 KV heads x 256); 36 Gated DeltaNet layers whose
    # state is (4 - 1) x (2 x 16 x 128 + 32 x 128) conv + 32 x 128 x 128 recurrent
    "qwen3-next-80b-a3b": (
        12 * kv_per_layer(2, 256),
        12 * kv_per_layer(2, 256) * L + 36 * (3 * 8192 + 32 * 128 * 128) * FP16,
    ),
}


def test_every_new_preset_is_checked_by_hand() -> None:
    assert set(HAND) == set(SIZING_PRESETS)
    assert all(shape.source for shape in SIZING_PRESETS.values())


@pytest.mark.parametrize("name", sorted(HAND))
def test_preset_bytes_equal_the_hand_computation(name: str) -> None:
    per_token, per_request = HAND[name]
    shape = sizing_preset(name)
    assert shape.bytes_per_token("fp16") == per_token
    assert shape.request_bytes(L, "fp16") == per_request
    assert sum(g.layers for g in shape.groups) == shape.layers


def test_gated_delta_net_state_is_vllms_shape() -> None:
    # conv_dim = 128 x 16 x 2 + 128 x 32 = 8192; conv (8192, 3); recurrent (32, 128, 128)
    assert gated_delta_net_state(16, 32, 128, 128, 4) == 24_576 + 524_288 == 548_864


def test_a_state_is_held_in_the_kv_dtype_unless_told() -> None:
    shape = sizing_preset("qwen3-next-80b-a3b")
    state = 36 * 548_864
    full = 12 * kv_per_layer(2, 256, 1)  # fp8: one byte an element
    assert shape.request_bytes(L, "fp8_e4m3") == full * L + state * 1
    assert shape.request_bytes(L, "fp8_e4m3", "fp32") == full * L + state * 4
    assert shape.request_bytes(1, "fp16") - shape.request_bytes(0, "fp16") == 12 * kv_per_layer(
        2, 256
    )  # one more token costs only the full layers


def test_a_window_bounds_a_requests_tokens_over_its_life() -> None:
    """Over a request's life (1024 in, 1024 out) a full layer holds 1536 tokens on
    average, a 128-token window 128; a window longer than the context, the context."""
    shape = sizing_preset("gpt-oss-120b")
    per_layer_group = 18 * kv_per_layer(8, 64)
    assert shape.avg_request_bytes(1024, 1024, "fp16") == per_layer_group * (1536 + 128)
    wide = ModelShape("w", 2, 8, 8, 64, groups=(LayerGroup("sliding", 2, 8, 64, window=10**6),))
    full = ModelShape("f", 2, 8, 8, 64)
    assert wide.avg_request_bytes(1024, 1024) == full.avg_request_bytes(1024, 1024)


def test_the_hybrid_budget_holds_about_twice_the_requests_at_long_context() -> None:
    """gpt-oss-120b's sliding half holds 128 tokens: at 128k context its batch is nearly
    twice what sizing every layer as full would give, and its longest request too."""
    shape = sizing_preset("gpt-oss-120b")
    as_full = ModelShape("all full", 36, 64, 8, 64)
    budget = 50 * 2**30
    split = ContextShape(0.5)
    hybrid = shape_batch_at_context(shape, budget, 131_072, split, "fp16")
    uniform = shape_batch_at_context(as_full, budget, 131_072, split, "fp16")
    assert uniform > 0 and 1.9 < hybrid / uniform <= 2.0
    longest = shape.longest_context(budget, "fp16")
    assert longest == (budget - 18 * kv_per_layer(8, 64) * 128) / (18 * kv_per_layer(8, 64))
    assert longest > 1.99 * as_full.longest_context(budget, "fp16")


def test_calc_json_totals_and_names_each_group(capsys) -> None:
    code, out, err = run_cli(
        capsys, "calc", "--preset", "qwen3-next-80b-a3b", "--input-tokens", "30000",
        "--output-tokens", "2000", "--json",
    )  # fmt: skip
    assert code == 0, err
    r = json.loads(out)
    full, state = r["groups"]
    assert (full["kind"], full["layers"], state["kind"], state["layers"]) == (
        "full",
        12,
        "state",
        36,
    )
    assert r["kv_bytes_per_token"] == full["kv_bytes_per_token"] == 12 * kv_per_layer(2, 256)
    assert state["state_bytes_per_request"] == 36 * 548_864 * FP16
    assert r["kv_bytes_per_request"] == full["kv_bytes_per_request"] + state["kv_bytes_per_request"]
    assert full["kv_bytes_per_request"] == 12 * kv_per_layer(2, 256) * 31_000
    assert full["share_of_request"] + state["share_of_request"] == pytest.approx(1.0)


def test_calc_on_a_device_counts_requests_and_tokens_per_group(capsys) -> None:
    args = ["calc", "--preset", "gpt-oss-120b", "--device", "h100-80", "--weight-dtype", "int4"]
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    r = json.loads(out)
    per_group = 18 * kv_per_layer(8, 64)
    budget = r["kv_budget_bytes"]
    assert r["max_avg_batch"] == int(budget // (per_group * (1536 + 128)))
    assert r["max_batch_max_reservation"] == int(budget // (per_group * (131_072 + 128)))
    assert r["tokens_in_budget"] == int((budget - per_group * 128) / per_group)
    code, out, err = run_cli(capsys, *args)
    assert "layers by form" in out and "sliding 128" in out


def test_calc_cliff_of_a_hybrid_model_is_later_than_all_full(capsys) -> None:
    base = ["calc", "cliff", "--device", "h100-80", "--weight-dtype", "int4", "--json"]
    code, out, _ = run_cli(capsys, *base, "--preset", "gpt-oss-120b")
    hybrid = json.loads(out)["scenarios"]
    code2, out2, _ = run_cli(
        capsys, *base, "--layers", "36", "--q-heads", "64", "--kv-heads", "8", "--head-dim",
        "64", "--params", "116830000000",
    )  # fmt: skip
    uniform = json.loads(out2)["scenarios"]
    assert code == code2 == 0
    for name in hybrid:
        assert hybrid[name]["cliff_context_len"] > 1.9 * uniform[name]["cliff_context_len"]


def test_an_unknown_preset_names_every_preset(capsys) -> None:
    code, _, err = run_cli(capsys, "calc", "--preset", "gpt-oss-7b")
    assert code != 0
    one_error(err, "unknown model preset 'gpt-oss-7b'", "llama3-8b", "qwen3-next-80b-a3b")


def test_a_group_must_hold_what_its_form_needs() -> None:
    with pytest.raises(KvscopeError, match="window"):
        LayerGroup("sliding", 4, 8, 64)
    with pytest.raises(KvscopeError, match="latent"):
        LayerGroup("mla", 4)
    with pytest.raises(KvscopeError, match="layers, not 5"):
        ModelShape("x", 5, 8, 8, 64, groups=(LayerGroup("full", 4, 8, 64),))


def test_offload_reloads_what_the_growing_layers_hold(capsys) -> None:
    """Reloading a long evicted prefix of gpt-oss-120b moves its 18 full layers' K and V
    per token (its sliding half holds 128 tokens): half the bytes, twice the ratio of
    sizing every layer as full."""
    base = ["calc", "offload", "--device", "h100-80", "--json"]
    code, out, _ = run_cli(capsys, *base, "--preset", "gpt-oss-120b")
    hybrid = json.loads(out)
    code2, out2, _ = run_cli(
        capsys, *base, "--layers", "36", "--q-heads", "64", "--kv-heads", "8", "--head-dim",
        "64", "--params", "116830000000",
    )  # fmt: skip
    uniform = json.loads(out2)
    assert code == code2 == 0
    assert (
        hybrid["kv_bytes_per_token"]
        == 18 * kv_per_layer(8, 64)
        == uniform["kv_bytes_per_token"] / 2
    )
    assert hybrid["recompute_over_load"] == pytest.approx(2 * uniform["recompute_over_load"])
    assert sizing_preset("qwen3-next-80b-a3b").growing_bytes_per_token() == 12 * kv_per_layer(
        2, 256
    )
