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

from engine.engine_config import WEIGHT_DTYPES
from engine.errors import ModelLoadError
from engine.model_config import ModelConfig

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Projection:
    """One weight matrix ``[out, in]`` in its storage format; ``proj(x)`` is ``x @ W.T`` in fp32.

    fp32 is the exact path (the oracle tests run it). bf16 halves the bytes
    read per step and uses the CPU's bf16 GEMMs (avx512_bf16/AMX: 3-5x the
    fp32 GEMM rate measured here at 32-512 rows); int8 stores per-output-channel
    symmetric weights (a quarter of the bytes, best for single-stream decode,
    which is bound by reading weights). Activations stay fp32 between layers;
    only the GEMM inputs are cast.
    """

    __slots__ = ("weight", "scales", "bias", "fmt")

    def __init__(
        self, weight: torch.Tensor, fmt: str = "fp32", bias: torch.Tensor | None = None
    ) -> None:
        self.fmt = fmt
        self.bias = bias
        self.scales = None
        if fmt == "fp32":
            self.weight = weight.float().contiguous()
        elif fmt == "bf16":
            self.weight = weight.to(torch.bfloat16).contiguous()
        elif fmt == "int8":
            scales = weight.abs().amax(1).clamp(min=1e-8) / 127.0
            self.weight = (
                torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            )
            self.scales = scales.to(torch.bfloat16)
        else:
            raise ModelLoadError(
                f"unknown weights dtype {fmt!r}; choose one of {', '.join(WEIGHT_DTYPES)}"
            )

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.weight.numel() * self.weight.element_size() + extra

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fmt == "fp32":
            return F.linear(x, self.weight, self.bias)
        xb = x.to(torch.bfloat16)
        if self.fmt == "bf16":
            out = F.linear(xb, self.weight).float()
        else:
            out = torch._weight_int8pack_mm(xb, self.weight, self.scales).float()
        return out if self.bias is None else out + self.bias


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    qkv: Projection  # [(Hq + 2 Hkv) * D, hidden]
    o_proj: Projection
    mlp_norm: torch.Tensor
    gate_up: Projection  # [2 * intermediate, hidden]
    down: Projection


class RotaryTable:
    """cos/sin tables for rotate-half RoPE (Hugging Face layout), built once."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        max_position: int,
        dtype: torch.dtype,
        device: str = "cpu",
    ) -> None:
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)

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

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        weights_dtype: str = "fp32",
        device: str = "cpu",
    ) -> None:
        self.config = config
        self.weights_dtype = weights_dtype

        def take(name: str) -> torch.Tensor:
            try:
                return weights[name].to(device=device, dtype=torch.float32).contiguous()
            except KeyError:
                raise ModelLoadError(f"checkpoint lacks tensor {name}") from None

        def proj(*names: str, bias: tuple[str, ...] = ()) -> Projection:
            b = torch.cat([take(n) for n in bias]) if bias else None
            w = take(names[0]) if len(names) == 1 else torch.cat([take(n) for n in names])
            return Projection(w, weights_dtype, b)

        self.embed = take("model.embed_tokens.weight")
        if self.embed.shape != (config.vocab_size, config.hidden_size):
            raise ModelLoadError(
                f"embedding shape {tuple(self.embed.shape)} does not match the config "
                f"({config.vocab_size}, {config.hidden_size})"
            )
        self.norm = take("model.norm.weight")
        self.lm_head = proj(
            "model.embed_tokens.weight" if config.tie_embeddings else "lm_head.weight"
        )
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
            bias = tuple(p + f"self_attn.{n}_proj.bias" for n in "qkv") if config.qkv_bias else ()
            self.layers.append(
                LayerWeights(
                    attn_norm=take(p + "input_layernorm.weight"),
                    qkv=proj(*qkv, bias=bias),
                    o_proj=proj(p + "self_attn.o_proj.weight"),
                    mlp_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=proj(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    down=proj(p + "mlp.down_proj.weight"),
                )
            )
        self.rope = RotaryTable(
            config.head_dim, config.rope_theta, config.max_position, torch.float32, device
        )

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights as stored (the fp32 embedding table for lookups included)."""
        total = self.embed.numel() * 4 + self.norm.numel() * 4
        if self.lm_head.weight is not self.embed:  # tied fp32 weights are one tensor
            total += self.lm_head.nbytes
        for layer in self.layers:
            total += (layer.attn_norm.numel() + layer.mlp_norm.numel()) * 4
            total += sum(p.nbytes for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
        return total

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
            qkv = layer.qkv(h)
            qk = apply_rotary(qkv[:, : (hq + hkv) * d].view(n, hq + hkv, d), cos, sin)
            q, k = qk[:, :hq], qk[:, hq:]
            v = qkv[:, (hq + hkv) * d :].view(n, hkv, d)
            attn = attend(i, q, k, v)
            x = x + layer.o_proj(attn.reshape(n, hq * d))
            h = rms_norm(x, layer.mlp_norm, eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        x = rms_norm(x[logits_rows], self.norm, eps)
        return self.lm_head(x)
