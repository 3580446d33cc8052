"""The fused Triton kernels (interpreter) against float64 references and the torch path:
RMSNorm with the residual add, SiLU-and-multiply, RoPE with the KV-cache write in every
KV format, and a whole tiny model's fused forward against its torch forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvscope.engine.model import apply_rotary
from kvscope.engine.sizing import KV_DTYPES
from kvscope.kernels.kv_quant import KVPages
from kvscope.kernels.triton_rmsnorm import add_rms_norm_triton
from kvscope.kernels.triton_rope_kv import fused_write_supported, rope_kv_write_triton
from kvscope.kernels.triton_silu import silu_mul_triton

TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


def rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 576])
def test_add_rms_norm_matches_float64(seed: int, dtype: torch.dtype, hidden: int) -> None:
    residual = torch.randn(3, hidden).to(dtype)
    delta = torch.randn(3, hidden).to(dtype)
    weight = (torch.rand(hidden) + 0.5).to(dtype)
    want_sum = residual.double() + delta.double()
    before = residual.clone()
    out = add_rms_norm_triton(delta, residual, weight, 1e-5)
    assert out.dtype == dtype and out.shape == residual.shape
    torch.testing.assert_close(residual.double(), want_sum, rtol=TOL[dtype], atol=TOL[dtype])
    ref = rms_ref(want_sum, weight, 1e-5)
    err = ((out.double() - ref).abs() / ref.abs().clamp(min=1)).max().item()
    assert err < 2 * TOL[dtype], f"seed {seed}: {err}"
    # Without a delta the residual is read, not written.
    plain = add_rms_norm_triton(None, before, weight, 1e-5)
    assert torch.equal(before, before.clone())
    torch.testing.assert_close(
        plain, F.rms_norm(before, (hidden,), weight, 1e-5), rtol=TOL[dtype], atol=TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_float64(seed: int, dtype: torch.dtype) -> None:
    gate_up = (torch.randn(2, 2 * 1536) * 3).to(dtype)
    gate, up = gate_up.double().chunk(2, -1)
    ref = F.silu(gate) * up
    out = silu_mul_triton(gate_up)
    assert out.shape == (2, 1536) and out.dtype == dtype
    err = ((out.double() - ref).abs() / ref.abs().clamp(min=1)).max().item()
    assert err < 2 * TOL[dtype], f"seed {seed}: {err}"


def rope_tables(head_dim: int, positions: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).double() / head_dim))
    freqs = torch.outer(torch.arange(positions).double(), inv)
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16])
def test_rope_kv_write_matches_reference(seed: int, kv_dtype: str, act: torch.dtype) -> None:
    hq, hkv, d, ps, tokens = 4, 2, 64, 4, 5
    cos64, sin64 = rope_tables(d)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d).to(act)
    positions = torch.tensor([0, 3, 7, 8, 40])
    slots = torch.tensor([5, 0, 11, 2, 9])  # scattered over 3 pages
    pages = KVPages.allocate(3, ps, hkv, d, kv_dtype)
    want_pages = KVPages.allocate(3, ps, hkv, d, kv_dtype)
    q = rope_kv_write_triton(
        qkv, positions, cos64.float(), sin64.float(), slots, pages, hq, hkv, d, torch.float32
    )
    x = qkv.double().view(tokens, hq + 2 * hkv, d)
    c, s = cos64[positions][:, None], sin64[positions][:, None]
    q_ref = apply_rotary(x[:, :hq], c, s)
    k_ref = apply_rotary(x[:, hq : hq + hkv], c, s).to(act)  # K rounds to the activations
    v_ref = x[:, hq + hkv :]
    torch.testing.assert_close(q.double(), q_ref, rtol=1e-5, atol=1e-5)
    want_pages.write(slots, k_ref.float(), v_ref.float())
    got, want = pages.dequantize(), want_pages.dequantize()
    # Quantised formats may round one step differently (fp8 conversion, ties, scale
    # rounding); everything must sit within one storage step of the torch path's write.
    # Relative bound for the float formats (one unit in the last place), absolute for the
    # integer ones (one quantisation step of these magnitudes).
    rel = {"fp32": 1e-6, "fp16": 2**-10, "bf16": 2**-7, "fp8_e4m3": 2**-3, "fp8_e5m2": 2**-2,
           "int8": 0.0, "int4": 0.0}[kv_dtype]  # fmt: skip
    if act == torch.bfloat16:  # K rounded to bf16 from fp32 (kernel) or float64 (reference)
        rel += 2**-7
    # fp8: one subnormal step too (the interpreter truncates fp8 subnormals).
    absolute = {"int8": 0.05, "int4": 0.6, "fp8_e4m3": 2**-9, "fp8_e5m2": 2**-16}.get(
        kv_dtype, 1e-6
    )
    excess = ((want - got).abs() - rel * want.abs() - absolute).max().item()
    assert excess <= 0, f"seed {seed}: {kv_dtype} pages differ from the torch write by {excess}"
    written = torch.zeros(3 * ps, dtype=torch.bool)
    written[slots] = True
    assert got.view(3, 2, ps, hkv, d).transpose(1, 2).flatten(0, 1)[~written].eq(0).all()


def test_int4_needs_a_power_of_two_half_head() -> None:
    assert fused_write_supported("int4", 128) and not fused_write_supported("int4", 96)
    assert fused_write_supported("int8", 96)
    pages = KVPages.allocate(1, 4, 1, 96, "int4")
    with pytest.raises(ValueError, match="no fused"):
        rope_kv_write_triton(
            torch.zeros(1, 3 * 96), torch.zeros(1, dtype=torch.long), torch.zeros(8, 96),
            torch.zeros(8, 96), torch.zeros(1, dtype=torch.long), pages, 1, 1, 96, torch.float32,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("weights_dtype", "kv_dtype"), [("fp32", "fp32"), ("bf16", "bf16"), ("bf16", "int8")]
)
def test_fused_engine_matches_torch_engine(weights_dtype: str, kv_dtype: str) -> None:
    """A tiny model's logits through the fused kernels (Triton attention) against the torch
    path's, prefill and decode steps alike: equal within 1e-4 in fp32; in bf16 no further
    from the fp32 logits than the torch path's own bf16 logits are (twice, at most)."""
    from kvscope.engine.engine import Engine
    from kvscope.engine.engine_config import EngineConfig
    from kvscope.engine.tiny import tiny_loaded

    def logits(weights: str, kv: str, fused: bool, backend: str) -> torch.Tensor:
        config = EngineConfig(
            weights_dtype=weights, kv_dtype=kv, attention_backend=backend, kv_budget_bytes=1 << 20
        )
        engine = Engine(config, loaded=tiny_loaded())
        engine.model.fused = fused
        return engine.score(list(range(1, 40)), chunk=16).float()

    got = logits(weights_dtype, kv_dtype, True, "triton")
    if weights_dtype == "fp32":
        torch.testing.assert_close(
            got, logits("fp32", kv_dtype, False, "torch"), rtol=1e-4, atol=1e-4
        )
        return
    exact = logits("fp32", "fp32", False, "torch")
    torch_err = (logits(weights_dtype, kv_dtype, False, "torch") - exact).abs().max().item()
    fused_err = (got - exact).abs().max().item()
    assert fused_err <= 2 * torch_err + 1e-3, (fused_err, torch_err)


def test_int4_weights_reproduce_a_q4_1_grid(seed: int) -> None:
    """Weights already on a Q4_1 grid (what a Q4_1 GGUF dequantizes to) survive int4
    packing up to the bf16 scales: the product is as close as bf16 weights' product."""
    from kvscope.engine.model import Projection

    out_dim, in_dim = 96, 128
    d = torch.rand(out_dim, in_dim // 32, 1) * 0.01 + 1e-3
    m = -torch.rand(out_dim, in_dim // 32, 1) * 0.05
    q = torch.randint(0, 16, (out_dim, in_dim // 32, 32)).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 sets d = (max - min) / 15, m = min: both ends are used
    w = (q * d + m).view(out_dim, in_dim)
    x = torch.randn(3, in_dim).bfloat16()
    ref = x.double() @ w.double().t()
    err4 = (Projection(w, "int4")(x).double() - ref).abs().max().item()
    err16 = (Projection(w, "bf16")(x).double() - ref).abs().max().item()
    assert err4 <= 2 * err16 + 1e-3, f"seed {seed}: int4 {err4} vs bf16 {err16}"
    residual = torch.randn(3, out_dim).bfloat16()
    summed = Projection(w, "int4").add(x, residual)
    torch.testing.assert_close(summed.double(), ref + residual.double(), rtol=0.02, atol=0.05)
