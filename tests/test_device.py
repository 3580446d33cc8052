"""Device selection on a machine without CUDA: auto means CPU, CUDA is a one-line error,
and ``--weights-dtype auto`` follows the CPU's bf16 flags."""

from __future__ import annotations

import pytest
import torch

from kvscope.app.cli import main
from kvscope.engine.device import cpu_has_native_bf16, resolve_device, resolve_weights_dtype
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import KvscopeError

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


def test_weights_dtype_auto_is_bf16_on_cuda_and_follows_the_cpu_elsewhere(monkeypatch):
    assert resolve_weights_dtype("auto", "cuda:0") == "bf16"
    assert resolve_weights_dtype("int8", "cpu") == "int8"
    monkeypatch.setattr("kvscope.engine.device.cpu_has_native_bf16", lambda: False)
    assert resolve_weights_dtype("auto", "cpu") == "fp32"
    monkeypatch.setattr("kvscope.engine.device.cpu_has_native_bf16", lambda: True)
    assert resolve_weights_dtype("auto", "cpu") == "bf16"
    assert EngineConfig(weights_dtype="auto").weights_dtype == "bf16"


def test_the_engine_config_keeps_fp32_as_its_default_for_the_oracle_tests():
    assert EngineConfig().weights_dtype == "fp32"


def test_run_and_generate_default_to_auto_device_and_weights():
    from kvscope.app.cli import build_parser

    for argv in (["generate", "hi"], ["run", "--headless"]):
        args = build_parser().parse_args(argv)
        assert (args.device, args.weights_dtype, args.load_format) == ("auto", "auto", "auto")


def test_engine_flags_reach_the_engine_config():
    from kvscope.app.cli import build_parser
    from kvscope.app.engine_options import engine_config_from_args

    argv = ["run", "--headless", "--device", "cpu", "--enforce-eager", "--load-format", "dummy"]
    argv += ["--model", "preset:smollm2-135m", "--weights-dtype", "fp32"]
    config = engine_config_from_args(build_parser().parse_args(argv))
    assert (config.device, config.enforce_eager, config.load_format) == ("cpu", True, "dummy")
    assert (config.model, config.weights_dtype, config.cost_device) == (
        "preset:smollm2-135m",
        "fp32",
        "cpu",  # the cost model's preset follows the execution device
    )
