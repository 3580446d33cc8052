"""Which device the engine runs on, and what that device does natively.

``--device auto`` means the first CUDA device when torch sees one, else the
CPU. Asking for CUDA where there is none is a one-line ``KvscopeError``, not
a torch traceback at the first tensor. ``--weights-dtype auto`` picks bf16
where matmuls run natively in bf16 (every CUDA GPU kvscope targets, CPUs
with avx512_bf16 or AMX) and fp32 elsewhere, where bf16 would be emulated
and slower than fp32.
"""

from __future__ import annotations

import re
import warnings
from functools import cache

from kvscope.engine.errors import KvscopeError
from kvscope.engine.presets import Device, device_preset, match_driver_name

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str) -> str:
    """``auto``/``cpu``/``cuda``/``cuda:N`` -> ``cpu`` or ``cuda:N`` (an index that exists)."""
    import torch  # here, so that building a config (and --help) does not load torch

    name = name.strip().lower()
    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    m = re.fullmatch(r"cuda(?::(\d+))?", name)
    if m is None:
        raise KvscopeError(f"unknown device {name!r}; choose {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        raise KvscopeError(
            f"--device {name} asked for CUDA but torch sees no CUDA device "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); "
            "use --device cpu"
        )
    index = int(m.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise KvscopeError(f"--device {name}: only {count} CUDA device(s) here")
    return f"cuda:{index}"


@cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU advertises bf16 dot products (avx512_bf16) or AMX tiles (amx_bf16)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def resolve_weights_dtype(name: str, device: str) -> str:
    """``auto`` -> ``bf16`` on CUDA or a bf16-capable CPU, else ``fp32``; other names unchanged."""
    if name != "auto":
        return name
    native = device.startswith("cuda") or cpu_has_native_bf16()
    return "bf16" if native else "fp32"


def synchronize(device: str) -> None:
    """Wait for queued device work (a no-op on the CPU), e.g. before reading a wall clock."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(torch.device(device))


def device_name(device: str) -> str:
    """The name the driver reports (NVML's, e.g. ``NVIDIA H200``), or ``cpu``."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def preset_match(device: str, fallback: str = "h100-80") -> tuple[Device, str | None]:
    """The peak table row for the device the engine runs on, and a note when it is a fallback.

    The row is found by the longest fragment of the driver's name
    (``engine.presets.match_driver_name``). A GPU the table does not know gets
    ``fallback`` (a figure is better than none for the offload cost model) and
    the note says so, for the caller to show.
    """
    return preset_for_name(device_name(device), fallback)


def preset_for_name(name: str, fallback: str = "h100-80") -> tuple[Device, str | None]:
    """``preset_match`` for a driver name (``cpu`` for the CPU)."""
    found = device_preset("cpu") if name == "cpu" else match_driver_name(name)
    if found is not None:
        return found, None
    return device_preset(fallback), (
        f"no preset for {name!r}: using {fallback}'s peaks (pass --cost-device to choose one)"
    )


def preset_for_device(device: str, fallback: str = "h100-80") -> Device:
    """``preset_match``'s row; a fallback is announced with a warning (shown on stderr)."""
    preset, note = preset_match(device, fallback)
    if note is not None:
        warnings.warn(note, stacklevel=2)
    return preset
