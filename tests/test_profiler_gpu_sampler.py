"""The GPU sampler: real figures with a GPU, nothing (and no error) without one."""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from kvscope.db import queries
from kvscope.engine.events import EventBus, GpuSample
from kvscope.profiler import hardware
from kvscope.profiler.gpu_sampler import GpuSampler
from kvscope.profiler.recorder import Recorder


def _has_nvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    def init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", init)


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int = 2) -> None:
    def unsupported(*args: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for name, fn in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: "NVIDIA H100 PCIe",
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=(h + 1) << 30, total=80 << 30),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=37 + h),
        "nvmlDeviceGetPowerUsage": lambda h: 250_000,
        "nvmlDeviceGetClockInfo": unsupported,
        "nvmlDeviceGetMaxClockInfo": lambda h, kind: 1593,
        "nvmlDeviceGetMemoryBusWidth": lambda h: 5120,
    }.items():
        monkeypatch.setattr(pynvml, name, fn)


def test_without_a_gpu_nothing_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_driver(monkeypatch)
    bus = EventBus()
    seen: list[GpuSample] = []
    bus.subscribe(seen.append)
    sampler = GpuSampler(bus, interval_s=0.01)
    assert sampler.start() is False and not sampler.available
    time.sleep(0.05)
    sampler.stop()
    assert seen == []
    assert hardware.describe_gpus() == []
    assert "peak_tflops" not in hardware.describe_hardware()


def test_samples_every_device_and_records_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_gpus(monkeypatch)
    bus = EventBus()
    rec = Recorder(tmp_path / "k.db", {}, "m", versions={})
    assert rec.run_id == 1
    bus.subscribe(rec.on_event)
    rec.start()
    sampler = GpuSampler(bus, interval_s=0.02, current_step=lambda: 7)
    assert sampler.start() is True
    time.sleep(0.15)
    sampler.stop()
    rec.finish()
    points = queries.gpu_series(tmp_path / "k.db", rec.run_id)
    assert {p.gpu_index for p in points} == {0, 1}
    assert len(points) >= 4
    first = points[0]
    assert first.utilization_pct == 37 and first.memory_used_bytes == 1 << 30
    assert first.memory_total_bytes == 80 << 30 and first.power_w == 250.0
    assert first.sm_clock_mhz is None  # unsupported reading: NaN, stored as NULL
    info = queries.run_info(tmp_path / "k.db", rec.run_id)
    assert info.hardware["gpus"][0]["name"] == "NVIDIA H100 PCIe"
    assert info.hardware["peak_tflops"] == 756.0  # the PCIe part, not the SXM one
    assert info.hardware["peak_gbps"] == pytest.approx(2 * 1593e6 * 5120 / 8 / 1e9)


def test_sample_reads_nan_for_unsupported_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, count=1)
    sampler = GpuSampler(EventBus())
    assert sampler.start()
    (sample,) = sampler.sample()
    sampler.stop()
    assert math.isnan(sample.sm_clock_mhz) and sample.step == -1


@pytest.mark.skipif(not _has_nvml(), reason="needs an NVIDIA GPU")
def test_real_gpu_readings_are_plausible() -> None:
    sampler = GpuSampler(EventBus())
    assert sampler.start()
    samples = sampler.sample()
    sampler.stop()
    assert samples
    for s in samples:
        assert 0 <= s.utilization_pct <= 100
        assert 0 < s.memory_used_bytes <= s.memory_total_bytes
        assert s.sm_clock_mhz > 0
    gpu = hardware.describe_gpus()[0]
    assert gpu["memory_total_bytes"] == samples[0].memory_total_bytes
    assert gpu["peak_gbps"] is None or 100 < gpu["peak_gbps"] < 20_000
