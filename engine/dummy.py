"""Dummy weights (vLLM's ``--load-format dummy``): a real model shape, seeded random weights.

``--model preset:llama3-8b --load-format dummy`` profiles KV behaviour and
throughput at real scale without downloading a checkpoint. Weights are drawn
on the target device in the storage dtype (normal, std 0.02, the Hugging Face
``initializer_range``; norms are ones), so building an 8B model takes
seconds. Text goes through a byte-level tokenizer (every byte one token,
ChatML specials for chat prompts) whose ids are clipped to the model's
vocabulary. The codec names no EOS token, so a dummy run's lengths follow the
workload, never the random model's choice of an end token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from kvscope.engine.errors import ModelLoadError
from kvscope.engine.loaded_model import LoadedModel
from kvscope.engine.model_config import ModelConfig
from kvscope.engine.presets import model_preset
from kvscope.engine.tokenizer import TextCodec

PRESET_PREFIX = "preset:"
SOURCE_PREFIX = "dummy:"
DEFAULT_PRESET = "smollm2-135m"
INIT_STD = 0.02
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@dataclass
class ClippedCodec(TextCodec):
    """A codec whose token ids never reach ``vocab_limit`` (a tiny model's vocabulary)."""

    vocab_limit: int = 0

    def encode(self, text: str) -> list[int]:
        top = self.vocab_limit - 1
        return [min(i, top) for i in super().encode(text)]


def byte_codec(vocab_size: int) -> TextCodec:
    """Byte-level tokenizer: 256 byte tokens, then the ChatML specials; no EOS."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return ClippedCodec(tok, eos_token_ids=[], chat_template=CHATML, vocab_limit=vocab_size)


def dummy_config(model: str | None) -> ModelConfig:
    """The shape to build: ``preset:NAME``, a Hugging Face directory's config.json, or SmolLM2."""
    if model is None:
        return model_preset(DEFAULT_PRESET)
    if model.startswith(PRESET_PREFIX):
        return model_preset(model.removeprefix(PRESET_PREFIX))
    path = Path(model)
    if path.is_dir():
        return ModelConfig.from_hf_config(path / "config.json")
    raise ModelLoadError(
        f"--load-format dummy needs preset:NAME or a Hugging Face directory, not {model!r}"
    )


def dummy_weights(
    config: ModelConfig,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Hugging Face-named tensors of ``config``'s shape, drawn from one seeded generator."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=dtype, device=device).mul_(INIT_STD)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_q_heads * d, config.num_kv_heads * d
    w = {"model.embed_tokens.weight": normal(config.vocab_size, h), "model.norm.weight": ones(h)}
    if not config.tie_embeddings:
        w["lm_head.weight"] = normal(config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            w[f"{p}self_attn.{name}_proj.weight"] = normal(rows, h)
            if config.qkv_bias:
                w[f"{p}self_attn.{name}_proj.bias"] = normal(rows)
        w[p + "self_attn.o_proj.weight"] = normal(h, q)
        w[p + "mlp.gate_proj.weight"] = normal(config.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = normal(config.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = normal(h, config.intermediate_size)
        w[p + "input_layernorm.weight"] = ones(h)
        w[p + "post_attention_layernorm.weight"] = ones(h)
    return w


def stored_weight_bytes(config: ModelConfig, weights_dtype: str, device: str = "cpu") -> int:
    """What ``DecoderModel.weight_bytes`` says of ``config`` once built, with no weight drawn:
    ``kvscope info`` describes an 8B dummy model at once, where building it drew 16 GB
    for over a minute. It follows ``engine.model``'s storage (a test holds the two equal
    for every format): embeddings and norms in the activation dtype; projections fp32,
    bf16, int8 with a bf16 scale per row, or int4 with a bf16 scale and zero per 32
    inputs; a tied LM head is the embedding table itself but for CPU bf16 (a packed
    copy) and int8/int4 (its own int8 matrix).
    """
    from kvscope.engine.model import INT4_GROUP, check_int4_shape, cpu_packs_bf16

    act = 4 if weights_dtype == "fp32" else 2
    on_cpu = torch.device(device).type == "cpu"  # CUDA runs fused kernels on plain layouts
    packs = weights_dtype == "bf16" and on_cpu and cpu_packs_bf16()

    def matrix(rows: int, cols: int, fmt: str = weights_dtype) -> int:
        if fmt == "int4":
            check_int4_shape(rows, cols)
            return rows * cols // 2 + cols // INT4_GROUP * rows * 2 * 2
        if fmt == "int8":
            return rows * cols + rows * 2
        return rows * cols * (4 if fmt == "fp32" else 2)

    h, v, inter = config.hidden_size, config.vocab_size, config.intermediate_size
    q, kv = config.num_q_heads * config.head_dim, config.num_kv_heads * config.head_dim
    total = v * h * act + h * act  # the embedding table and the final norm
    if not config.tie_embeddings or weights_dtype not in ("fp32", "bf16"):
        total += matrix(v, h, "int8" if weights_dtype == "int4" else weights_dtype)
    elif packs:
        total += matrix(v, h)
    layer = 2 * h * act + matrix(q + 2 * kv, h) + matrix(h, q)
    layer += matrix(2 * inter, h) + matrix(h, inter)
    return total + config.num_layers * layer


def dummy_shell(model: str | ModelConfig | None) -> LoadedModel:
    """A dummy model without weights: an engine draws them, builds its model, drops them."""
    config = model if isinstance(model, ModelConfig) else dummy_config(model)
    return LoadedModel(config, {}, byte_codec(config.vocab_size), f"{SOURCE_PREFIX}{config.name}")


def is_dummy_shell(loaded: LoadedModel) -> bool:
    return not loaded.weights and loaded.source.startswith(SOURCE_PREFIX)


def load_dummy(
    model: str | ModelConfig | None,
    weights_dtype: str = "fp32",
    device: str = "cpu",
    seed: int = 0,
) -> LoadedModel:
    """A ``LoadedModel`` with dummy weights, drawn in the dtype they will be stored in."""
    shell = dummy_shell(model)
    dtype = torch.float32 if weights_dtype == "fp32" else torch.bfloat16
    return dataclasses.replace(shell, weights=dummy_weights(shell.config, dtype, device, seed))
