"""What a run ran on and with: stored with every run so figures can be compared.

The GPU part comes from NVML (package nvidia-ml-py) and is simply absent
without a GPU. ``peak_tflops`` / ``peak_gbps`` are the device's dense 16-bit
tensor peak and memory bandwidth, against which kernel throughput is shown;
they stay absent when unknown (a CPU, an unlisted GPU).
"""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
from importlib import metadata
from typing import Any

import pynvml

from kvscope.engine.errors import KvscopeError
from kvscope.engine.presets import device_preset

# Dense FP16/BF16 tensor-core TFLOP/s by marketing name fragment (NVIDIA data
# sheets, SXM parts where both exist). Longest fragment wins.
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "H100 PCIe": 756.0,
    "H800": 989.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "A800": 312.0,
    "A10": 125.0,
    "A10G": 70.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "V100": 125.0,
    "T4": 65.0,
}


def peak_tflops(gpu_name: str) -> float | None:
    """The device preset the driver's name matches (``engine.presets``, the table the cost
    model and ``kvscope calc`` use), else the longest fragment above."""
    try:
        return device_preset(gpu_name).fp16_tflops
    except KvscopeError:
        pass
    matches = [key for key in PEAK_TFLOPS if key in gpu_name]
    return PEAK_TFLOPS[max(matches, key=len)] if matches else None


def describe_gpus() -> list[dict[str, Any]]:
    """One dict per NVIDIA GPU (name, memory, peak figures), or [] without NVML."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            gpu: dict[str, Any] = {
                "index": index,
                "name": name,
                "memory_total_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
                "peak_tflops": peak_tflops(name),
            }
            try:
                mem_clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
                bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
                # Double data rate: two transfers per clock.
                gpu["peak_gbps"] = 2 * mem_clock_mhz * 1e6 * bus_bits / 8 / 1e9
            except pynvml.NVMLError:
                gpu["peak_gbps"] = None
            gpus.append(gpu)
        return gpus
    finally:
        pynvml.nvmlShutdown()


def describe_hardware() -> dict[str, Any]:
    """CPU, memory and GPUs; ``peak_tflops``/``peak_gbps`` of GPU 0 at the top level."""
    hardware: dict[str, Any] = {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": describe_gpus(),
    }
    if hardware["gpus"]:
        hardware["peak_tflops"] = hardware["gpus"][0]["peak_tflops"]
        hardware["peak_gbps"] = hardware["gpus"][0]["peak_gbps"]
    return hardware


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def describe_versions() -> dict[str, Any]:
    """Versions of Python, SQLite and the packages whose behaviour shapes the figures."""
    versions: dict[str, Any] = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    for package in ("kvscope", "torch", "triton", "numpy", "sqlite-utils"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    torch = sys.modules.get("torch")  # already imported by the engine; never import it here
    if torch is not None and torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions
