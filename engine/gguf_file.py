"""Read a GGUF file: metadata fields and dequantized weights in Hugging Face naming.

llama.cpp stores the Q and K projection rows permuted for its interleaved rope
layout; we undo that permutation so the weights equal the Hugging Face ones
and one RoPE implementation (rotate-half) serves every loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvscope.engine.errors import ModelLoadError
from kvscope.engine.model_config import ModelConfig

_GGUF_TO_HF = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def open_gguf(path: Path) -> Any:
    """A ``gguf.GGUFReader``; any failure to parse becomes one clear error."""
    from gguf import GGUFReader

    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    try:
        return GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/IndexError/struct errors
        raise ModelLoadError(
            f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}"
        ) from None


def read_fields(reader: Any) -> dict[str, Any]:
    """All metadata as plain Python values."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except Exception as exc:
            raise ModelLoadError(f"GGUF metadata field {key} is unreadable: {exc}") from None
    return out


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    if base == "token_embd":
        return "model.embed_tokens.weight"
    if base == "output_norm":
        return "model.norm.weight"
    if base == "output":
        return "lm_head.weight"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _GGUF_TO_HF:
        return f"model.layers.{parts[1]}.{_GGUF_TO_HF[parts[2]]}.{suffix}"
    raise ModelLoadError(f"unexpected tensor {gguf_name!r} in GGUF file")


def read_weights(reader: Any, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Dequantize every tensor to float32, in Hugging Face names and layout."""
    from gguf import dequantize

    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        try:
            array = dequantize(tensor.data, tensor.tensor_type)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot dequantize {tensor.name} ({tensor.tensor_type.name}): {exc}"
            ) from None
        name = hf_name(tensor.name)
        if name.endswith("q_proj.weight"):
            array = _unpermute_rope(array, config.num_q_heads)
        elif name.endswith("k_proj.weight"):
            array = _unpermute_rope(array, config.num_kv_heads)
        weights[name] = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
    return weights
