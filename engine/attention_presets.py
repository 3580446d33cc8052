"""Sizing presets of models whose layers are not all full attention (``kvscope calc``).

The engine runs Llama-family decoders (``engine.presets``); these models it only
sizes. Each shape is built from the model's published config.json, as
transformers 5.25.0's configuration classes quote it (their defaults, or the
model card where the class's defaults are another size), and says so in
``source``. How the config's fields become layer groups:

- gpt-oss: ``layer_types`` alternates ``sliding_attention`` (even layers) and
  ``full_attention``; ``sliding_window`` 128.
- Gemma 3: layer i is full when (i + 1) % ``sliding_window_pattern`` (6) == 0,
  else sliding with ``sliding_window``.
- Llama 4: layer i is full (NoPE) when (i + 1) % ``no_rope_layer_interval`` (4)
  == 0, else chunked with ``attention_chunk_size``.
- DeepSeek-V3 and Kimi K2 (MLA): one latent of ``kv_lora_rank`` +
  ``qk_rope_head_dim`` elements per token per layer.
- Qwen3-Next: layer i is full attention when (i + 1) % ``full_attention_interval``
  (4) == 0, else Gated DeltaNet, whose state per request per layer is vLLM's
  ``gated_delta_net_state_shape``: a conv state of (conv kernel - 1) x (2 x key
  heads x key dim + value heads x value dim) and a recurrent state of value heads
  x key dim x value dim.
"""

from __future__ import annotations

from dataclasses import replace

from kvscope.engine.attention_forms import LayerGroup
from kvscope.engine.errors import KvscopeError
from kvscope.engine.presets import MODELS, model_preset
from kvscope.engine.sizing import ModelShape


def _alternating(layers: int, every: int, local: LayerGroup, full: LayerGroup) -> tuple:
    """``layers`` split as (i + 1) % every == 0 full, the others ``local`` (the groups'
    own layer counts are placeholders)."""
    n_full = layers // every
    return replace(full, layers=n_full), replace(local, layers=layers - n_full)


def gated_delta_net_state(k_heads: int, v_heads: int, k_dim: int, v_dim: int, conv: int) -> int:
    """Elements of one Gated DeltaNet layer's state per request (vLLM's shapes, TP 1)."""
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return (conv - 1) * conv_dim + v_heads * k_dim * v_dim


def _gpt_oss(name: str, layers: int, params: int, source: str) -> ModelShape:
    sliding = LayerGroup("sliding", layers // 2, 8, 64, window=128)
    return ModelShape(name, layers, 64, 8, 64, params, 131072,
                      (LayerGroup("full", layers // 2, 8, 64), sliding), source)  # fmt: skip


SIZING_PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _gpt_oss(
            "gpt-oss-120b",
            36,
            116_830_000_000,
            "openai/gpt-oss-120b config.json = transformers GptOssConfig defaults: 36 layers, "
            "64 heads, 8 KV heads, head_dim 64, sliding_window 128, layer_types alternating; "
            "117B parameters (model card)",
        ),  # fmt: skip
        _gpt_oss(
            "gpt-oss-20b",
            24,
            20_910_000_000,
            "openai/gpt-oss-20b config.json: num_hidden_layers 24 (32 experts), the rest as "
            "gpt-oss-120b's; 21B parameters (model card)",
        ),  # fmt: skip
        ModelShape(
            "gemma-3-27b",
            62,
            32,
            16,
            128,
            27_000_000_000,
            131072,
            _alternating(
                62,
                6,
                LayerGroup("sliding", 1, 16, 128, window=1024),
                LayerGroup("full", 1, 16, 128),
            ),
            "google/gemma-3-27b-it config.json (text_config): 62 layers, 32 heads, 16 KV heads, "
            "head_dim 128, sliding_window 1024, sliding_window_pattern 6 (transformers "
            "Gemma3TextConfig's layer_types rule)",
        ),  # fmt: skip
        ModelShape(
            "mistral-small-3.1",
            40,
            32,
            8,
            128,
            24_000_000_000,
            131072,
            (),
            "mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json (text_config): 40 "
            "layers, 32 heads, 8 KV heads, head_dim 128, sliding_window null: every layer full",
        ),  # fmt: skip
        ModelShape(
            "llama-4-scout",
            48,
            40,
            8,
            128,
            109_000_000_000,
            10_485_760,
            _alternating(
                48, 4, LayerGroup("chunked", 1, 8, 128, window=8192), LayerGroup("full", 1, 8, 128)
            ),
            "meta-llama/Llama-4-Scout-17B-16E config.json = transformers Llama4TextConfig "
            "defaults: 48 layers, 40 heads, 8 KV heads, head_dim 128, attention_chunk_size 8192, "
            "a NoPE full layer every 4th (no_rope_layer_interval); 109B parameters, 10M context",
        ),  # fmt: skip
        ModelShape(
            "deepseek-v3",
            61,
            128,
            128,
            192,
            671_000_000_000,
            163840,
            (LayerGroup("mla", 61, latent_dim=512 + 64),),
            "deepseek-ai/DeepSeek-V3 config.json = transformers DeepseekV3Config defaults: 61 "
            "layers, 128 heads, kv_lora_rank 512, qk_rope_head_dim 64 (qk head 128 + 64); 671B "
            "parameters, 163,840 context",
        ),  # fmt: skip
        ModelShape(
            "kimi-k2",
            61,
            64,
            64,
            192,
            1_040_000_000_000,
            131072,
            (LayerGroup("mla", 61, latent_dim=512 + 64),),
            "moonshotai/Kimi-K2-Instruct config.json (DeepseekV3 architecture): 61 layers, 64 "
            "heads, kv_lora_rank 512, qk_rope_head_dim 64; 1.04T parameters (model card)",
        ),  # fmt: skip
        ModelShape(
            "qwen3-next-80b-a3b",
            48,
            16,
            2,
            256,
            80_000_000_000,
            262144,
            (
                LayerGroup("full", 12, 2, 256),
                LayerGroup("state", 36, state_elements=gated_delta_net_state(16, 32, 128, 128, 4)),
            ),
            "Qwen/Qwen3-Next-80B-A3B-Instruct config.json = transformers Qwen3NextConfig "
            "defaults: 48 layers, full_attention_interval 4, 16 heads, 2 KV heads, head_dim "
            "256; Gated DeltaNet 16 key and 32 value heads of 128, conv kernel 4; 262,144 "
            "context (model card)",
        ),  # fmt: skip
    )
}


def sizing_preset(name: str) -> ModelShape:
    """The model called ``name`` for sizing: one of the presets above, or one the engine
    runs (``engine.presets``); case, spaces and underscores are ignored."""
    wanted = name.strip().lower().replace(" ", "-").replace("_", "-")
    for key, shape in SIZING_PRESETS.items():
        if wanted in (key, key.replace("-", "")):
            return shape
    try:
        return ModelShape.from_config(model_preset(name))
    except KvscopeError:
        names = ", ".join([*MODELS, *SIZING_PRESETS])
        raise KvscopeError(f"unknown model preset {name!r}; choose one of {names}") from None
