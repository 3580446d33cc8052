"""A Llama-family decoder in torch over a flat, unpadded batch of tokens.

The tokens of many requests are concatenated into one ``[T, hidden]`` batch:
projections and MLPs run as one matmul for the whole step, and only attention
needs to know where requests begin and end. That part is delegated to an
``attend(layer, q, k, v)`` callback supplied by the engine, which writes K/V
into the paged cache and runs the attention backend, so the model knows
nothing about pages.

Q/K/V and gate/up projections are fused into one matmul each (fewer, larger
operations per step), built once from the Hugging Face-named weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.errors import ModelLoadError

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor


class RotaryTable:
    """cos/sin tables for rotate-half RoPE (Hugging Face layout), built once."""

    def __init__(self, head_dim: int, theta: float, max_position: int, dtype: torch.dtype) -> None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


class DecoderModel:
    """Weights plus a forward pass; stateless between steps (state lives in the KV cache)."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> None:
        self.config = config
        self.dtype = dtype

        def take(name: str) -> torch.Tensor:
            try:
                return weights[name].to(dtype).contiguous()
            except KeyError:
                raise ModelLoadError(f"checkpoint lacks tensor {name}") from None

        self.embed = take("model.embed_tokens.weight")
        if self.embed.shape != (config.vocab_size, config.hidden_size):
            raise ModelLoadError(
                f"embedding shape {tuple(self.embed.shape)} does not match the config "
                f"({config.vocab_size}, {config.hidden_size})"
            )
        self.norm = take("model.norm.weight")
        self.lm_head = self.embed if config.tie_embeddings else take("lm_head.weight")
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            bias = None
            if config.qkv_bias:
                bias = torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            self.layers.append(
                LayerWeights(
                    attn_norm=take(p + "input_layernorm.weight"),
                    qkv=qkv,
                    qkv_bias=bias,
                    o_proj=take(p + "self_attn.o_proj.weight"),
                    mlp_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]),
                    down=take(p + "mlp.down_proj.weight"),
                )
            )
        self.rope = RotaryTable(config.head_dim, config.rope_theta, config.max_position, dtype)

    @property
    def weight_bytes(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            tensors += [layer.attn_norm, layer.qkv, layer.o_proj, layer.mlp_norm, layer.gate_up, layer.down]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        logits_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Logits [len(logits_rows), vocab] for the chosen rows of a flat batch."""
        cfg = self.config
        hq, hkv, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        n = token_ids.shape[0]
        cos, sin = self.rope.lookup(positions)
        x = F.embedding(token_ids, self.embed)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            qk = apply_rotary(qkv[:, : (hq + hkv) * d].view(n, hq + hkv, d), cos, sin)
            q, k = qk[:, :hq], qk[:, hq:]
            v = qkv[:, (hq + hkv) * d :].view(n, hkv, d)
            attn = attend(i, q, k, v)
            x = x + F.linear(attn.reshape(n, hq * d), layer.o_proj)
            h = rms_norm(x, layer.mlp_norm, eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        x = rms_norm(x[logits_rows], self.norm, eps)
        return F.linear(x, self.lm_head)
