"""Model shape: from GGUF metadata, a Hugging Face ``config.json``, or a preset.

One ``ModelConfig`` describes every Llama-family decoder the engine runs
(Llama, Mistral, Qwen2-style with q/k/v biases, SmolLM2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.engine.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 2048
    tie_embeddings: bool = False
    qkv_bias: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r}; kvscope runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_q_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"query heads ({self.num_q_heads}) must be a multiple of KV heads ({self.num_kv_heads})"
            )

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings once when tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_q_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h
        embed = v * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embed + h

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any], name: str = "") -> ModelConfig:
        arch = str(fields.get("general.architecture", ""))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {arch!r} in GGUF; kvscope runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def get(key: str, default: Any = None) -> Any:
            value = fields.get(f"{arch}.{key}", default)
            if value is None:
                raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
            return value

        hidden = int(get("embedding_length"))
        heads = int(get("attention.head_count"))
        vocab = fields.get(f"{arch}.vocab_size") or len(fields.get("tokenizer.ggml.tokens", []))
        return cls(
            architecture=arch,
            num_layers=int(get("block_count")),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_q_heads=heads,
            num_kv_heads=int(get("attention.head_count_kv", heads)),
            head_dim=int(fields.get(f"{arch}.attention.key_length", hidden // heads)),
            vocab_size=int(vocab),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            max_position=int(get("context_length", 2048)),
            tie_embeddings=True,  # decided by the loader from the tensors present
            qkv_bias=arch == "qwen2",
            name=name or str(fields.get("general.name", "")),
        )

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelLoadError(f"no config.json at {path}") from None
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:  # a directory, not UTF-8 text, ...
            raise ModelLoadError(f"cannot read {path} as a config.json: {exc}") from None
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} is not a config.json (not a JSON object)")
        if "model_type" not in raw:
            raise ModelLoadError(f"{path} has no 'model_type'")
        model_type = raw["model_type"]
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {model_type!r} in {path}; kvscope runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def count(key: str, default: int | None = None) -> int:
            """A size or count: a whole number >= 1 (2.5 or true had been taken as 2 or
            1, and 0 heads had been a division by zero)."""
            value = raw[key] if default is None else (raw.get(key) or default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"{path}: {key} must be a whole number >= 1, got {value!r}")
            return value

        required = ("num_hidden_layers", "num_attention_heads", "hidden_size",
                    "intermediate_size", "vocab_size")  # fmt: skip
        missing = next((k for k in required if k not in raw), None)
        if missing is not None:  # what is missing first, then what is wrong
            raise ModelLoadError(f"{path} has no {missing!r}")
        try:
            heads = count("num_attention_heads")
            hidden = count("hidden_size")
            return cls(
                architecture=model_type,
                num_layers=count("num_hidden_layers"),
                hidden_size=hidden,
                intermediate_size=count("intermediate_size"),
                num_q_heads=heads,
                num_kv_heads=count("num_key_value_heads", heads),
                head_dim=count("head_dim", hidden // heads),
                vocab_size=count("vocab_size"),
                rope_theta=float(
                    raw.get(
                        "rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0)
                    )
                ),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position=count("max_position_embeddings", 2048),
                tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
                name=path.parent.name,
            )
        except KeyError as exc:
            raise ModelLoadError(f"{path} has no {exc.args[0]!r}") from None
        except (AttributeError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise ModelLoadError(f"{path} has a bad value: {exc}") from None
