"""Models and accelerators known by name, so sizing and cost models need no files.

Model presets are full ``ModelConfig`` shapes copied from each model's Hugging
Face ``config.json`` (their ``num_params`` match the published counts). Device
figures are spec-sheet peaks (dense, no sparsity) except ``cpu``, which was
measured on the project's 2-core development machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

from kvscope.engine.errors import KvscopeError
from kvscope.engine.model_config import ModelConfig

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Device:
    """An accelerator's memory and speeds. GB/s and TFLOP/s are decimal (1e9, 1e12).

    ``fp16_tflops`` is the dense (no sparsity) 16-bit tensor peak, which is the
    same for fp16 and bf16 on every device listed. ``nvml_names`` are the names
    the driver reports (``nvidia-smi``, NVML, ``torch.cuda.get_device_name``), so
    a profiler finds the row for the GPU it runs on; ``fragments`` are the words
    of such a name that select this row (see ``match_driver_name``).
    """

    name: str
    memory_gib: float
    fp16_tflops: float
    hbm_gbps: float
    pcie_gbps: float
    nvml_names: tuple[str, ...] = ()
    fragments: tuple[str, ...] = ()


MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig(
            name="llama3-8b",
            architecture="llama",
            num_layers=32,
            hidden_size=4096,
            intermediate_size=14336,
            num_q_heads=32,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
            rope_theta=500000.0,
            max_position=8192,
        ),
        ModelConfig(
            name="llama3-70b",
            architecture="llama",
            num_layers=80,
            hidden_size=8192,
            intermediate_size=28672,
            num_q_heads=64,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
            rope_theta=500000.0,
            max_position=8192,
        ),
        ModelConfig(
            name="mistral-7b",  # v0.1
            architecture="mistral",
            num_layers=32,
            hidden_size=4096,
            intermediate_size=14336,
            num_q_heads=32,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=32000,
            max_position=32768,
        ),
        ModelConfig(
            name="qwen2.5-7b",
            architecture="qwen2",
            num_layers=28,
            hidden_size=3584,
            intermediate_size=18944,
            num_q_heads=28,
            num_kv_heads=4,
            head_dim=128,
            vocab_size=152064,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position=32768,
            qkv_bias=True,
        ),
        ModelConfig(
            name="smollm2-135m",
            architecture="llama",
            num_layers=30,
            hidden_size=576,
            intermediate_size=1536,
            num_q_heads=9,
            num_kv_heads=3,
            head_dim=64,
            vocab_size=49152,
            rope_theta=100000.0,
            max_position=8192,
            tie_embeddings=True,
        ),
    )
}

# memory_gib is what nvidia-smi reports as total (81559 MiB on an H100 SXM, not 80 GiB).
# PCIe is one direction of an x16 link: Gen4 32 GB/s, Gen5 64 GB/s (GH200: NVLink-C2C,
# 450 GB/s each way). Peaks are NVIDIA's datasheet figures for dense bf16 tensor math
# (the sparsity figure halved) and memory bandwidth.
# ``fragments``: the words of the driver's name that pick the row, longest match first
# (``NVIDIA H200 NVL`` matches ``h200 nvl`` before ``h200``; ``NVIDIA GH200 480GB``
# matches ``gh200``, a word of its own, never ``h200``). The rows added for issue 22
# (h100-nvl, h200-nvl, gh200, gh200-144, l40s, rtx-6000-ada) take memory_gib from the
# board's nominal capacity, not from an nvidia-smi seen here.
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("a100-40", 40.0, 312, 1555, 32, ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
               ("a100 40gb",)),
        Device("a100-80", 80.0, 312, 2039, 32, ("NVIDIA A100-SXM4-80GB",), ("a100", "a100 80gb")),
        Device("a100-80-pcie", 80.0, 312, 1935, 32, ("NVIDIA A100 80GB PCIe",),
               ("a100 80gb pcie",)),
        Device("h100-80", 79.65, 989, 3350, 64, ("NVIDIA H100 80GB HBM3",),
               ("h100", "h100 sxm", "h100 sxm5", "h100 hbm3")),
        Device("h100-pcie", 79.65, 756, 2000, 64, ("NVIDIA H100 PCIe",), ("h100 pcie",)),
        Device("h100-nvl", 93.58, 835, 3900, 64, ("NVIDIA H100 NVL",), ("h100 nvl",)),
        Device("h200-141", 140.4, 989, 4800, 64, ("NVIDIA H200",), ("h200",)),
        Device("h200-nvl", 140.4, 835, 4800, 64, ("NVIDIA H200 NVL",), ("h200 nvl",)),
        Device("gh200", 95.58, 989, 4000, 450, ("NVIDIA GH200 480GB",), ("gh200",)),
        Device("gh200-144", 139.8, 989, 4900, 450, ("NVIDIA GH200 144G HBM3e",),
               ("gh200 144g", "gh200 hbm3e")),
        Device("l40s", 44.99, 362, 864, 32, ("NVIDIA L40S",), ("l40s",)),
        Device("l4", 22.49, 121, 300, 32, ("NVIDIA L4",), ("l4",)),
        Device("rtx-4090", 23.99, 165, 1008, 32, ("NVIDIA GeForce RTX 4090",), ("rtx 4090",)),
        Device("rtx-6000-ada", 47.99, 364, 960, 32, ("NVIDIA RTX 6000 Ada Generation",),
               ("rtx 6000 ada",)),
        # The 2-core dev machine: its RAM; a bf16 GEMM at n=2048 (fp16 GEMMs are
        # not accelerated there: 0.26 GFLOP/s); a 1 GiB memcpy, which also stands
        # in for "PCIe" because an offload tier on a CPU is more RAM.
        Device("cpu", 23.5, 0.85, 25, 25),
    )
}  # fmt: skip


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "-").replace("_", "-")


def _words(name: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", name.lower())) - {""}


def _lookup(table: dict[str, T], name: str, what: str) -> T:
    wanted = _key(name)
    for key, value in table.items():
        if wanted in (key, key.replace("-", "")):
            return value
    raise KvscopeError(f"unknown {what} {name!r}; choose one of {', '.join(table)}")


def match_driver_name(name: str) -> Device | None:
    """The device whose longest fragment is all words of ``name`` (a driver's name such as
    ``NVIDIA H100 NVL``), None when no fragment matches.

    Longest means most words, then most characters: ``h100 nvl`` beats ``h100``.
    """
    words = _words(name)
    best: tuple[int, int] = (0, 0)
    found = None
    for device in DEVICES.values():
        for fragment in device.fragments:
            parts = fragment.split()
            rank = (len(parts), len(fragment))
            if rank > best and words.issuperset(parts):
                best, found = rank, device
    return found


def model_preset(name: str) -> ModelConfig:
    """The model called ``name`` (case, spaces and underscores are ignored)."""
    return _lookup(MODELS, name, "model preset")


def device_preset(name: str) -> Device:
    """The device called ``name``, e.g. ``h100-80``, ``RTX 4090``, ``cpu``, or its
    NVML name (``NVIDIA H100 80GB HBM3``)."""
    try:
        return _lookup(DEVICES, name, "device")
    except KvscopeError:
        found = match_driver_name(name)
        if found is None:
            raise
        return found
