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

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvscope.engine.engine_config import WEIGHT_DTYPES
from kvscope.engine.errors import ModelLoadError
from kvscope.engine.kv_storage import StepKV
from kvscope.engine.model_config import ModelConfig

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Projection:
    """One weight matrix ``[out, in]`` in its storage format; ``proj(x)`` is ``x @ W.T``.

    fp32 is the exact path (the oracle tests run it): fp32 in, fp32 out. bf16
    and int8 take and return bf16 (``DecoderModel`` keeps its activations in
    bf16 for them, so no GEMM is wrapped in casts). bf16 halves the bytes read
    per step and uses the CPU's bf16 GEMMs where it has them (avx512_bf16/AMX);
    int8 stores per-output-channel symmetric weights (a quarter of the bytes,
    best for single-stream decode on the CPU, which is bound by reading weights).
    ``proj.add(x, residual)`` is ``residual + x @ W.T`` in one GEMM where the
    format allows (``addmm``): the residual add costs no op of its own.

    bf16 weights on the CPU are stored in oneDNN's blocked layout (``packed``),
    reordered once here (``pack=False`` keeps the plain layout CUDA uses): at one
    row ``F.linear`` on a plain bf16 weight ran at half the speed (1-thread GEMV at
    the model's shapes: 12-15 GB/s plain, 20-35 GB/s packed; as fast or faster at
    4-512 rows too but for the QKV shape at 500 rows), with the same bits.
    """

    __slots__ = ("weight", "weight_t", "scales", "bias", "fmt", "packed")

    def __init__(
        self,
        weight: torch.Tensor,
        fmt: str = "fp32",
        bias: torch.Tensor | None = None,
        pack: bool = True,
    ) -> None:
        self.fmt = fmt
        self.scales = None
        self.packed = False
        if fmt == "fp32":
            self.weight = weight.float().contiguous()
        elif fmt == "bf16":
            self.weight = weight.to(torch.bfloat16).contiguous()
            on_cpu = self.weight.device.type == "cpu"
            if pack and on_cpu and cpu_packs_bf16():
                self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight)
                self.packed = True
        elif fmt == "int8":
            scales = weight.abs().amax(1).clamp(min=1e-8) / 127.0
            self.weight = (
                torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            )
            self.scales = scales.to(torch.bfloat16)
        elif fmt == "int4":
            self.weight, self.scales = _int4_pack(weight.float())
        else:
            raise ModelLoadError(
                f"unknown weights dtype {fmt!r}; choose one of {', '.join(WEIGHT_DTYPES)}"
            )
        self.bias = None if bias is None else bias.to(activation_dtype(fmt))
        plain = fmt in ("fp32", "bf16") and not self.packed
        self.weight_t = self.weight.t() if plain else None  # a view, for addmm

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.weight.numel() * self.weight.element_size() + extra

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return _mkldnn_linear(x, self.weight, self.bias, "none", [], "")
        if self.weight_t is not None:
            return F.linear(x, self.weight, self.bias)
        if self.fmt == "int8":
            out = torch._weight_int8pack_mm(x, self.weight, self.scales)
        else:
            out = torch._weight_int4pack_mm_for_cpu(x, self.weight, INT4_GROUP, self.scales)
        return out if self.bias is None else out + self.bias

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + proj(x)`` (no bias: o_proj and down have none in Llama models)."""
        if self.packed and self.bias is None:
            return _mkldnn_linear.binary(x, residual, self.weight, None, "add")
        if self.weight_t is None or self.bias is not None or x.dim() != 2:
            return residual + self(x)
        return torch.addmm(residual, x, self.weight_t)


_mkldnn_linear = torch.ops.mkldnn._linear_pointwise  # oneDNN's linear on a packed weight


@functools.cache
def cpu_packs_bf16() -> bool:
    """Whether oneDNN's packed bf16 linear runs on this CPU: it needs AVX-512 (BW, VL, DQ)
    or AVX-NE-CONVERT, so an AVX2-only CPU (many AMD EPYCs) keeps the plain layout."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


INT4_GROUP = 32  # Q4_1's block: a Q4_1 checkpoint's weights come back exactly on this grid
INT4_ROWS = 16  # torch's CPU int4 packing takes out-features in multiples of 16


def check_int4_shape(out_dim: int, in_dim: int) -> None:
    """Refuse, in one line, a matrix torch's int4 packing cannot hold (it raised a bare
    RuntimeError from inside the packing for out-features not a multiple of 16)."""
    if in_dim % INT4_GROUP:
        raise ModelLoadError(
            f"int4 weights need in-features divisible by {INT4_GROUP}, got {in_dim}"
        )
    if out_dim % INT4_ROWS:
        raise ModelLoadError(
            f"int4 weights need out-features divisible by {INT4_ROWS}, got {out_dim}"
        )


def _int4_pack(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit groups of 32 along the input dim, packed for torch's CPU int4 GEMM.

    Per group, ``w = q * d + m`` with ``q`` in 0..15, ``d = (max - min) / 15`` and
    ``m = min``: llama.cpp's Q4_1 format, so weights dequantized from a Q4_1 file land
    back on their own grid. torch's kernel dequantizes ``(q - 8) * scale + zero``,
    so ``zero = m + 8 d``; scale and zero are stored in bf16 (the kernel's dtype).
    """
    out_dim, in_dim = weight.shape
    check_int4_shape(out_dim, in_dim)
    groups = weight.view(out_dim, in_dim // INT4_GROUP, INT4_GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-10)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    packed = torch._convert_weight_to_int4pack_for_cpu(
        q.view(out_dim, in_dim).to(torch.int32).contiguous(), 1
    )
    zero = low + 8 * scale
    scales = torch.stack((scale, zero), -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return packed, scales  # scales: [in / 32, out, 2]


# Steps of at most this many rows run their layers on one thread (not the fp32 path).
# Each layer is a chain of short ops (four GEMMs of tens of microseconds at 4 bits), and
# waking OpenMP's passive workers (engine/__init__.py) for each costs about as much as
# the second core saves; on a loaded machine a 2-thread barrier also waits for a peer
# the scheduler took away. Batch-1 int4 decode measured 70 vs 57 tok/s, 8 sequences
# 214 vs 127, 32 sequences 345 vs 182 (load average 4.5; alike on a quiet machine).
SERIAL_ROWS = 32


def activation_dtype(weights_dtype: str) -> torch.dtype:
    """The dtype activations travel in between layers: fp32 for fp32 weights (the exact
    path), bf16 otherwise (the GEMMs take and return bf16)."""
    return torch.float32 if weights_dtype == "fp32" else torch.bfloat16


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    qkv: Projection  # [(Hq + 2 Hkv) * D, hidden]
    o_proj: Projection
    mlp_norm: torch.Tensor
    gate_up: Projection  # [2 * intermediate, hidden]
    down: Projection
    # The norm weights twice over, for rms_norm_one_row.
    attn_norm_doubled: torch.Tensor = torch.empty(0)
    mlp_norm_doubled: torch.Tensor = torch.empty(0)

    def __post_init__(self) -> None:
        self.attn_norm_doubled = torch.cat((self.attn_norm, self.attn_norm))
        self.mlp_norm_doubled = torch.cat((self.mlp_norm, self.mlp_norm))


class RotaryTable:
    """cos/sin tables for rotate-half RoPE (Hugging Face layout), built once.

    ``sin_signed`` is ``sin`` with its first half negated: ``x * cos +
    x.roll(D/2) * sin_signed`` is rotate-half RoPE in three ops (roll, not
    neg + cat), with the same products and sums, so the same bits.
    """

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
        half = head_dim // 2
        self.sin_signed = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm, one fused op on the CPU (bit-equal to the Hugging Face formula in fp32)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_one_row(x: torch.Tensor, doubled: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm`` of one row ``[1, d]`` as one native LayerNorm over ``[x, -x]``, whose
    mean is zero (to rounding), so its variance is ``mean(x^2)``; ``doubled`` is the
    weight twice over, and the first half is kept (contiguous, for one row). Two ops
    instead of the eight F.rms_norm decomposes into on the CPU (5.5 vs 10 us a call, 61
    calls a decode step); equal to it in bf16 but for about 1 value in 5,000 (one bf16
    ulp). For the bf16-activation paths only, never the fp32 oracle."""
    d = x.shape[-1]
    return F.layer_norm(torch.cat((x, x.neg()), -1), (2 * d,), doubled, None, eps)[:, :d]


def rope_into(
    dst: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor
) -> None:
    """``dst = rope(x)`` (``dst`` may be ``x`` itself: the roll reads a copy)."""
    rolled = x.roll(x.shape[-1] // 2, -1)
    torch.add(x * cos, rolled * sin_signed, out=dst)


class DecoderModel:
    """Weights plus a forward pass; stateless between steps (state lives in the KV cache).

    Activations stay in one dtype end to end (``activation_dtype``: fp32 for
    fp32 weights, bf16 otherwise), so no GEMM is wrapped in casts. On CUDA (or
    with ``fused=True`` under Triton's interpreter, in tests) each layer runs
    the fused Triton kernels of ``kernels.fused``: the residual add inside
    RMSNorm, RoPE inside the KV-cache write (quantisation included), SiLU
    inside the gate-up product. The torch path (the CPU's) takes the fusions
    that cost nothing: one-op RMSNorm, the residual add inside ``addmm``, RoPE
    written in place into the QKV output so K and V leave in one index_put.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        weights_dtype: str = "fp32",
        device: str = "cpu",
        fused: bool | None = None,
    ) -> None:
        self.config = config
        self.weights_dtype = weights_dtype
        self.act_dtype = activation_dtype(weights_dtype)
        self.fused = torch.device(device).type == "cuda" if fused is None else fused
        self.on_cpu = torch.device(device).type == "cpu"
        act = self.act_dtype

        def take(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            try:
                return weights[name].to(device=device, dtype=dtype).contiguous()
            except KeyError:
                raise ModelLoadError(f"checkpoint lacks tensor {name}") from None

        def proj(*names: str, bias: tuple[str, ...] = ()) -> Projection:
            b = torch.cat([take(n) for n in bias]) if bias else None
            w = take(names[0]) if len(names) == 1 else torch.cat([take(n) for n in names])
            return Projection(w, weights_dtype, b, pack=not self.fused)

        # The lookup table in the activation dtype: a bf16 model's embeddings come out bf16.
        self.embed = take("model.embed_tokens.weight", act)
        if self.embed.shape != (config.vocab_size, config.hidden_size):
            raise ModelLoadError(
                f"embedding shape {tuple(self.embed.shape)} does not match the config "
                f"({config.vocab_size}, {config.hidden_size})"
            )
        self.norm = take("model.norm.weight", act)
        self.norm_doubled = torch.cat((self.norm, self.norm))  # for rms_norm_one_row
        if config.tie_embeddings and weights_dtype in ("fp32", "bf16"):
            # One tensor, not two (bf16 on the CPU keeps a packed copy: Projection says why).
            self.lm_head = Projection(self.embed, weights_dtype, pack=not self.fused)
        else:
            # int4 keeps the LM head in int8: GGUF files store the (tied) embeddings at
            # 8 bits (SmolLM2's Q4_1 file: Q8_0), and 4-bit logits cost accuracy.
            head = take("model.embed_tokens.weight" if config.tie_embeddings else "lm_head.weight")
            head_fmt = "int8" if weights_dtype == "int4" else weights_dtype
            self.lm_head = Projection(head, head_fmt, pack=not self.fused)
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
            bias = tuple(p + f"self_attn.{n}_proj.bias" for n in "qkv") if config.qkv_bias else ()
            self.layers.append(
                LayerWeights(
                    attn_norm=take(p + "input_layernorm.weight", act),
                    qkv=proj(*qkv, bias=bias),
                    o_proj=proj(p + "self_attn.o_proj.weight"),
                    mlp_norm=take(p + "post_attention_layernorm.weight", act),
                    gate_up=proj(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    down=proj(p + "mlp.down_proj.weight"),
                )
            )
        self.rope = RotaryTable(
            config.head_dim, config.rope_theta, config.max_position, torch.float32, device
        )
        # The torch path's tables in the activation dtype (the fused kernels read fp32).
        self._cos = self.rope.cos.to(act)
        self._sin_signed = self.rope.sin_signed.to(act)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights as stored (the embedding table for lookups included)."""
        total = self.embed.numel() * self.embed.element_size()
        total += self.norm.numel() * self.norm.element_size()
        if self.lm_head.weight is not self.embed:  # tied weights are one tensor
            total += self.lm_head.nbytes
        for layer in self.layers:
            total += layer.attn_norm.numel() * layer.attn_norm.element_size() * 2
            total += sum(p.nbytes for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
        return total

    def q_dtype(self, kv_dtype: str) -> torch.dtype:
        """Queries go to attention in the KV dtype when it is a float format (the kernels'
        dots then take one operand type), else in the activation dtype."""
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(
            kv_dtype, self.act_dtype
        )

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        logits_rows: torch.Tensor,
        kv: StepKV | None = None,
    ) -> torch.Tensor:
        """fp32 logits [len(logits_rows), vocab] for the chosen rows of a flat batch.

        With ``kv`` the model writes each layer's rotated K and V into the cache
        itself (fused with RoPE) and calls ``attend(layer, q, None, None)``;
        without it ``attend`` gets the rotated K and V to write.
        """
        if self.fused:
            return self._forward_fused(token_ids, positions, attend, logits_rows, kv)
        threads = torch.get_num_threads()
        serial = self.on_cpu and self.weights_dtype != "fp32" and threads > 1
        if not serial or token_ids.shape[0] > SERIAL_ROWS:
            return self._forward_torch(token_ids, positions, attend, logits_rows, kv)
        # The LM head, one long GEMM, takes the threads back (SERIAL_ROWS says why not
        # the layers).
        torch.set_num_threads(1)
        try:
            x = self._forward_torch(token_ids, positions, attend, logits_rows, kv, head=False)
        finally:
            torch.set_num_threads(threads)
        return self.lm_head(x).float()

    def _forward_torch(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        logits_rows: torch.Tensor,
        kv: StepKV | None,
        head: bool = True,
    ) -> torch.Tensor:
        """The torch path; ``head=False`` stops at the final norm of the logits rows."""
        cfg = self.config
        hq, d = cfg.num_q_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        n = token_ids.shape[0]
        cos = self._cos[positions].unsqueeze(1)
        sin = self._sin_signed[positions].unsqueeze(1)
        q_dtype = self.q_dtype(kv.kv_dtype) if kv is not None else self.act_dtype
        one_row = n == 1 and self.act_dtype != torch.float32

        def norm(x: torch.Tensor, weight: torch.Tensor, doubled: torch.Tensor) -> torch.Tensor:
            return rms_norm_one_row(x, doubled, eps) if one_row else rms_norm(x, weight, eps)

        x = F.embedding(token_ids, self.embed)
        for i, layer in enumerate(self.layers):
            h = norm(x, layer.attn_norm, layer.attn_norm_doubled)
            attn = self._rope_attend(i, layer.qkv(h), cos, sin, attend, kv, q_dtype)
            x = layer.o_proj.add(attn.reshape(n, hq * d).to(self.act_dtype), x)
            h = norm(x, layer.mlp_norm, layer.mlp_norm_doubled)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = layer.down.add(F.silu(gate) * up, x)
        x = norm(x[logits_rows], self.norm, self.norm_doubled)
        return self.lm_head(x).float() if head else x

    def _rope_attend(
        self,
        layer: int,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        attend: AttendFn,
        kv: StepKV | None,
        q_dtype: torch.dtype,
    ) -> torch.Tensor:
        """One layer's attention from its QKV output, with torch's RoPE (both paths use it:
        the fused one where its RoPE-and-write kernel does not apply). RoPE is applied in
        place, so K and V sit side by side, rotated: ``kv`` writes both in one index_put;
        without ``kv``, ``attend`` gets them to write."""
        cfg = self.config
        hq, hkv, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        n = qkv.shape[0]
        qk = qkv[:, : (hq + hkv) * d].view(n, hq + hkv, d)
        rope_into(qk, qk, cos, sin_signed)
        q = qk[:, :hq]
        if kv is None:
            return attend(layer, q, qk[:, hq:], qkv[:, (hq + hkv) * d :].view(n, hkv, d))
        kv.write_kv(layer, qkv[:, hq * d :].view(n, 2, hkv, d))
        return attend(layer, q if q.dtype == q_dtype else q.to(q_dtype), None, None)

    def _forward_fused(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        logits_rows: torch.Tensor,
        kv: StepKV | None,
    ) -> torch.Tensor:
        """The Triton path: about ten launches per layer (see bench/launch_count.py)."""
        from kvscope.kernels.triton_rmsnorm import add_rms_norm_triton
        from kvscope.kernels.triton_rope_kv import fused_write_supported, rope_kv_write_triton
        from kvscope.kernels.triton_silu import silu_mul_triton

        cfg = self.config
        hq, hkv, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        n = token_ids.shape[0]
        fused_write = kv is not None and fused_write_supported(kv.kv_dtype, d)
        q_dtype = self.q_dtype(kv.kv_dtype) if kv is not None else self.act_dtype
        if not fused_write:
            cos = self._cos[positions].unsqueeze(1)
            sin = self._sin_signed[positions].unsqueeze(1)
        residual = F.embedding(token_ids, self.embed)
        h = add_rms_norm_triton(None, residual, self.layers[0].attn_norm, eps)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(h)
            if fused_write:
                q = rope_kv_write_triton(
                    qkv, positions, self.rope.cos, self.rope.sin, kv.slots, kv.pages(i),
                    hq, hkv, d, q_dtype,
                )  # fmt: skip
                attn = attend(i, q, None, None)
            else:
                attn = self._rope_attend(i, qkv, cos, sin, attend, kv, q_dtype)
            o = layer.o_proj(attn.reshape(n, hq * d).to(self.act_dtype))
            h = add_rms_norm_triton(o, residual, layer.mlp_norm, eps)
            down = layer.down(silu_mul_triton(layer.gate_up(h)))
            last = i + 1 == len(self.layers)
            h = add_rms_norm_triton(
                down, residual, self.norm if last else self.layers[i + 1].attn_norm, eps
            )
        return self.lm_head(h[logits_rows]).float()
