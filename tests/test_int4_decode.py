"""The CPU decode path of the quantized weight formats: one-row RMSNorm as a LayerNorm,
layers run on one thread for small steps (engine/model.py SERIAL_ROWS), with the caller's
thread count given back whatever happens, and bf16 weights in oneDNN's packed layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kvscope.engine.model as model_module
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.model import (
    DecoderModel,
    Projection,
    cpu_packs_bf16,
    rms_norm,
    rms_norm_one_row,
)
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import tiny_loaded


@pytest.mark.parametrize("seed", range(3))
def test_one_row_rms_norm_equals_rms_norm(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 576, generator=g) * (1 + 4 * seed)
    w = torch.rand(576, generator=g) + 0.5
    exact = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w
    got = rms_norm_one_row(x, torch.cat((w, w)), 1e-5)
    torch.testing.assert_close(got.double(), exact, rtol=2e-6, atol=1e-6)
    assert got.shape == (1, 576) and got.is_contiguous()  # the int4 GEMM needs contiguous rows
    xb, wb = x.bfloat16(), w.bfloat16()
    ours, torchs = rms_norm_one_row(xb, torch.cat((wb, wb)), 1e-5), rms_norm(xb, wb, 1e-5)
    assert ours.dtype == torch.bfloat16
    # At most one bf16 ulp apart, and equal almost everywhere.
    ulp = torchs.float().abs() * 2**-7
    assert ((ours.float() - torchs.float()).abs() <= ulp + 1e-30).all()
    assert (ours == torchs).float().mean() >= 0.99


def _engine(weights_dtype: str) -> Engine:
    config = EngineConfig(kv_budget_bytes=1 << 20, weights_dtype=weights_dtype, prefix_cache=False)
    return Engine(config, loaded=tiny_loaded())


def _decode_logits(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The logits of every forward of a greedy 6-token generation (prefill, then decodes)."""
    seen: list[torch.Tensor] = []
    forward = model_module.DecoderModel.forward.__get__(engine.model)  # not an earlier spy

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen.append(out.clone())
        assert torch.get_num_threads() == 2  # given back after every step
        return out

    monkeypatch.setattr(engine.model, "forward", spy)
    engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=6, ignore_eos=True))
    return seen


@pytest.mark.parametrize("weights_dtype", ["int4", "int8", "bf16"])
def test_serial_layers_give_the_threaded_logits(monkeypatch, weights_dtype: str) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = _engine(weights_dtype)
        calls: list[int] = []
        set_threads = torch.set_num_threads
        monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), set_threads(n)))
        serial = _decode_logits(engine, monkeypatch)
        assert calls == [1, 2] * len(serial)  # every step (prefill of 5 rows too) went serial
        monkeypatch.setattr(model_module, "SERIAL_ROWS", 0)
        calls.clear()
        threaded = _decode_logits(engine, monkeypatch)
        assert calls == []
    finally:
        torch.set_num_threads(threads)
    assert len(serial) == len(threaded) == 6
    for a, b in zip(serial, threaded, strict=True):
        assert torch.equal(a, b)  # a GEMM's row is one thread's work: same bits


def test_the_exact_path_keeps_its_threads(monkeypatch) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = _engine("fp32")
        calls: list[int] = []
        set_threads = torch.set_num_threads
        monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), set_threads(n)))
        monkeypatch.setattr(model_module, "rms_norm_one_row", None)  # never called in fp32
        assert len(_decode_logits(engine, monkeypatch)) == 6
        assert calls == []
    finally:
        torch.set_num_threads(threads)


def test_threads_come_back_when_a_step_fails(monkeypatch) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = _engine("int4")

        def broken(*args, **kwargs):
            raise RuntimeError("attention failed")

        monkeypatch.setattr(model_module.DecoderModel, "_rope_attend", broken)
        with pytest.raises(RuntimeError, match="attention failed"):
            engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_one_row_norm_is_used_for_a_decode_row_only(monkeypatch) -> None:
    rows: list[int] = []
    real = model_module.rms_norm_one_row

    def spy(x, doubled, eps):
        rows.append(x.shape[0])
        return real(x, doubled, eps)

    monkeypatch.setattr(model_module, "rms_norm_one_row", spy)
    engine = _engine("int4")
    engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=3, ignore_eos=True))
    # Two decode steps (after the 5-row prefill), 2 layers x 2 norms + the final norm each.
    assert rows == [1] * 2 * 5


@pytest.mark.skipif(not cpu_packs_bf16(), reason="oneDNN's bf16 linear needs AVX-512 here")
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_bf16_projection_gives_the_plain_bits(rows: int) -> None:
    """bf16 weights on the CPU run oneDNN's packed linear (fast at one row); it must give
    the plain F.linear / addmm bits, residual add included, at the model's shapes."""
    g = torch.Generator().manual_seed(rows)
    for out_dim, in_dim in ((960, 576), (576, 1536)):
        w = torch.randn(out_dim, in_dim, generator=g) * 0.05
        packed, plain = Projection(w, "bf16"), Projection(w, "bf16", pack=False)
        assert packed.packed and packed.weight.is_mkldnn and not plain.packed
        assert packed.nbytes == plain.nbytes == out_dim * in_dim * 2
        x = torch.randn(rows, in_dim, generator=g).bfloat16()
        residual = torch.randn(rows, out_dim, generator=g).bfloat16()
        assert torch.equal(packed(x), F.linear(x, plain.weight))
        assert torch.equal(packed.add(x, residual), torch.addmm(residual, x, plain.weight.t()))


def test_only_the_cpu_torch_path_packs() -> None:
    loaded = tiny_loaded()
    cpu = DecoderModel(loaded.config, loaded.weights, "bf16")
    fused = DecoderModel(loaded.config, loaded.weights, "bf16", fused=True)  # CUDA's stand-in
    # Packed where oneDNN's bf16 linear runs on this CPU (AVX-512), plain elsewhere.
    packs = cpu_packs_bf16()
    assert all(p.packed == packs for p in (cpu.lm_head, cpu.layers[0].qkv, cpu.layers[0].down))
    assert not any(p.packed for p in (fused.lm_head, fused.layers[0].qkv, fused.layers[0].down))
    assert not DecoderModel(loaded.config, loaded.weights, "fp32").layers[0].qkv.packed
