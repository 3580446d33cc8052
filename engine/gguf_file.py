"""Read a GGUF file: metadata fields and dequantized weights in Hugging Face naming.

llama.cpp stores the Q and K projection rows permuted for its interleaved rope
layout; we undo that permutation so the weights equal the Hugging Face ones
and one RoPE implementation (rotate-half) serves every loader.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import ModelLoadError
from engine.model_config import ModelConfig

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


# GGUF metadata value types -> fixed byte sizes (8: string, 9: array are variable).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# 4-bit block formats (ggml type names): the file's own precision is about 4 bits a weight.
FOUR_BIT_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS", "MXFP4"})


def tensor_types(path: Path) -> dict[str, tuple[str, list[int]]]:
    """``{tensor name: (ggml type name, shape)}`` from the header alone.

    ``gguf.GGUFReader`` parses every metadata array into numpy (about 5.5 s for
    SmolLM2's tokenizer); this walks the header with struct and skips the arrays,
    so deciding a default from the file's precision costs milliseconds.
    """
    import mmap
    import struct

    from gguf import GGMLQuantizationType

    def fail(why: str) -> ModelLoadError:
        return ModelLoadError(f"{path} is not a readable GGUF file (truncated or corrupt?): {why}")

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def take(fmt: str) -> int:
            nonlocal pos
            (value,) = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return value

        def skip_string() -> None:
            nonlocal pos
            length = take("Q")
            pos += length

        def skip_value(kind: int) -> None:
            nonlocal pos
            if kind in _SCALAR_BYTES:
                pos += _SCALAR_BYTES[kind]
            elif kind == 8:
                skip_string()
            elif kind == 9:
                inner, count = take("I"), take("Q")
                if inner in _SCALAR_BYTES:
                    pos += _SCALAR_BYTES[inner] * count
                else:
                    for _ in range(count):
                        skip_value(inner)
            else:
                raise fail(f"unknown metadata value type {kind}")

        try:
            if buf[:4] != b"GGUF":
                raise fail("no GGUF magic")
            pos = 4
            version = take("I")
            if version < 2:
                raise fail(f"GGUF version {version} is not supported")
            n_tensors, n_kv = take("Q"), take("Q")
            for _ in range(n_kv):
                skip_string()
                skip_value(take("I"))
            found: dict[str, tuple[str, list[int]]] = {}
            for _ in range(n_tensors):
                length = take("Q")
                name = bytes(buf[pos : pos + length]).decode("utf-8", "replace")
                pos += length
                shape = [take("Q") for _ in range(take("I"))]
                kind = take("I")
                take("Q")  # data offset
                try:
                    type_name = GGMLQuantizationType(kind).name
                except ValueError:
                    type_name = f"type{kind}"
                found[name] = (type_name, shape)
        except (struct.error, IndexError) as exc:
            raise fail(str(exc)) from None
    return found


def is_four_bit(path: Path) -> bool:
    """True when most of the file's layer matrices (``blk.*``, by elements) are 4-bit."""
    four = total = 0
    for name, (kind, shape) in tensor_types(path).items():
        if name.startswith("blk.") and len(shape) >= 2:
            elements = math.prod(shape)
            total += elements
            four += elements if kind in FOUR_BIT_TYPES else 0
    return total > 0 and 2 * four > total
