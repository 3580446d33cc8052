"""Device selection on a machine without CUDA: auto means CPU, CUDA is a one-line error,
and ``--weights-dtype auto`` runs a 4-bit GGUF as int4 on the CPU, else follows the CPU's
bf16 flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.cli import main
from engine.device import cpu_has_native_bf16, resolve_device, resolve_weights_dtype
from engine.engine_config import EngineConfig
from engine.errors import KvscopeError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA paths")


def test_auto_and_cpu_resolve_to_cpu_without_cuda():
    assert resolve_device("auto") == "cpu"
    assert resolve_device(" CPU ") == "cpu"
    assert EngineConfig(device="auto").device == "cpu"


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_asking_for_cuda_without_it_is_a_clear_error(name):
    with pytest.raises(KvscopeError, match=f"--device {name} asked for CUDA.*use --device cpu"):
        resolve_device(name)


def test_unknown_device_names_are_refused():
    with pytest.raises(KvscopeError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    with pytest.raises(KvscopeError, match="unknown device 'cuda:x'"):
        EngineConfig(device="cuda:x")


def test_cli_device_cuda_without_cuda_exits_2_with_one_line(capsys):
    code = main(["generate", "hi", "--device", "cuda", "--max-tokens", "1"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("kvscope: error: --device cuda asked for CUDA")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "flags, native",
    [
        ("fpu sse2 avx512f avx512_bf16 amx_tile", True),
        ("fpu sse2 amx_bf16", True),
        ("fpu sse2 avx2 avx512f", False),
    ],
)
def test_cpu_bf16_detection_reads_the_flags_line(tmp_path, flags, native):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    assert cpu_has_native_bf16(str(info)) is native
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is False


def _gguf(path, layer_type: str) -> str:
    """A small GGUF with string and number arrays in its metadata (as a tokenizer's) and two
    layers of matrices stored as ``layer_type``; returns its path."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_token_types([1] * 300)
    writer.add_string("general.name", "tiny")
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((300, 64), dtype=np.float32))
    kind = GGMLQuantizationType[layer_type]
    for i in range(2):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32))
        for name, rows in (("attn_q", 64), ("ffn_up", 128)):
            w = rng.standard_normal((rows, 64), dtype=np.float32)
            data = w if kind == GGMLQuantizationType.F32 else quants.quantize(w, kind)
            writer.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_the_gguf_header_scan_matches_the_reader(tmp_path):
    from gguf import GGUFReader

    from engine.gguf_file import is_four_bit, tensor_types

    for kind, four in (("Q4_1", True), ("Q4_0", True), ("Q8_0", False), ("F32", False)):
        path = _gguf(tmp_path / f"{kind}.gguf", kind)
        reader = GGUFReader(path)
        expected = {t.name: (t.tensor_type.name, [int(n) for n in t.shape]) for t in reader.tensors}
        assert tensor_types(Path(path)) == expected
        assert is_four_bit(Path(path)) is four, kind


def test_the_default_model_is_a_four_bit_file():
    from engine.gguf_file import is_four_bit, tensor_types
    from engine.loader import default_model_path

    kinds = [kind for kind, _ in tensor_types(default_model_path()).values()]
    assert (kinds.count("Q4_1"), kinds.count("Q8_0"), len(kinds)) == (210, 1, 272)
    assert is_four_bit(default_model_path())


@pytest.mark.parametrize("native", [False, True])
def test_weights_dtype_auto_runs_a_four_bit_gguf_as_int4_on_the_cpu(monkeypatch, tmp_path, native):
    monkeypatch.setattr("engine.device.cpu_has_native_bf16", lambda: native)
    follows_cpu = "bf16" if native else "fp32"
    q4, f32 = _gguf(tmp_path / "q4.gguf", "Q4_1"), _gguf(tmp_path / "f32.gguf", "F32")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    assert resolve_weights_dtype("auto", "cpu") == "int4"  # the default SmolLM2 Q4_1 file
    assert resolve_weights_dtype("auto", "cpu", q4) == "int4"
    assert EngineConfig(weights_dtype="auto", model=q4).weights_dtype == "int4"
    # Not 4-bit weights read from a file: the CPU's flags decide, as before.
    assert resolve_weights_dtype("auto", "cpu", f32) == follows_cpu
    assert resolve_weights_dtype("auto", "cpu", None, "dummy") == follows_cpu
    assert resolve_weights_dtype("auto", "cpu", "preset:smollm2-135m") == follows_cpu
    assert resolve_weights_dtype("auto", "cpu", str(tmp_path)) == follows_cpu  # an HF folder
    # A broken or missing file is the loader's error to report, not this choice's.
    assert resolve_weights_dtype("auto", "cpu", str(broken)) == follows_cpu
    assert resolve_weights_dtype("auto", "cpu", str(tmp_path / "missing.gguf")) == follows_cpu
    # CUDA has no int4 kernel: bf16 there, whatever the file.
    assert resolve_weights_dtype("auto", "cuda:0", q4) == "bf16"
    assert resolve_weights_dtype("int8", "cpu", q4) == "int8"  # explicit names are kept


def test_the_engine_config_keeps_fp32_as_its_default_for_the_oracle_tests():
    assert EngineConfig().weights_dtype == "fp32"


def test_run_and_generate_default_to_auto_device_and_weights():
    from app.cli import build_parser

    for argv in (["generate", "hi"], ["run", "--headless"]):
        args = build_parser().parse_args(argv)
        assert (args.device, args.weights_dtype, args.load_format) == ("auto", "auto", "auto")


def test_engine_flags_reach_the_engine_config():
    from app.cli import build_parser
    from app.engine_options import engine_config_from_args

    argv = ["run", "--headless", "--device", "cpu", "--enforce-eager", "--load-format", "dummy"]
    argv += ["--model", "preset:smollm2-135m", "--weights-dtype", "fp32"]
    config = engine_config_from_args(build_parser().parse_args(argv))
    assert (config.device, config.enforce_eager, config.load_format) == ("cpu", True, "dummy")
    assert (config.model, config.weights_dtype, config.cost_device) == (
        "preset:smollm2-135m",
        "fp32",
        "cpu",  # the cost model's preset follows the execution device
    )
