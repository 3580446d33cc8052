"""Models and accelerators known by name, so sizing and cost models need no files.

Model presets are full ``ModelConfig`` shapes copied from each model's Hugging
Face ``config.json`` (their ``num_params`` match the published counts). Device
figures are spec-sheet peaks (dense, no sparsity) except ``cpu``, which was
measured on the project's 2-core development machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from engine.errors import KvscopeError
from engine.model_config import ModelConfig

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Device:
    """An accelerator's memory and speeds. GB/s and TFLOP/s are decimal (1e9, 1e12).

    ``fp16_tflops`` is the dense (no sparsity) 16-bit tensor peak, which is the
    same for fp16 and bf16 on every device listed. ``nvml_names`` are the names
    the driver reports (``nvidia-smi``, NVML, ``torch.cuda.get_device_name``), so
    a profiler finds the row for the GPU it runs on.
    """

    name: str
    memory_gib: float
    fp16_tflops: float
    hbm_gbps: float
    pcie_gbps: float
    nvml_names: tuple[str, ...] = ()


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
# PCIe is one direction of an x16 link: Gen4 32 GB/s, Gen5 64 GB/s. Peaks are
# NVIDIA's datasheet figures for dense bf16 tensor math and memory bandwidth.
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("a100-40", 40.0, 312, 1555, 32, ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB")),
        Device("a100-80", 80.0, 312, 2039, 32, ("NVIDIA A100-SXM4-80GB",)),
        Device("a100-80-pcie", 80.0, 312, 1935, 32, ("NVIDIA A100 80GB PCIe",)),
        Device("h100-80", 79.65, 989, 3350, 64, ("NVIDIA H100 80GB HBM3",)),
        Device("h100-pcie", 79.65, 756, 2000, 64, ("NVIDIA H100 PCIe",)),
        Device("h200-141", 140.4, 989, 4800, 64, ("NVIDIA H200",)),
        Device("l4", 22.49, 121, 300, 32, ("NVIDIA L4",)),
        Device("rtx-4090", 23.99, 165, 1008, 32, ("NVIDIA GeForce RTX 4090",)),
        # The 2-core dev machine: its RAM; a bf16 GEMM at n=2048 (fp16 GEMMs are
        # not accelerated there: 0.26 GFLOP/s); a 1 GiB memcpy, which also stands
        # in for "PCIe" because an offload tier on a CPU is more RAM.
        Device("cpu", 23.5, 0.85, 25, 25),
    )
}


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "-").replace("_", "-")


def _lookup(table: dict[str, T], name: str, what: str) -> T:
    wanted = _key(name)
    for key, value in table.items():
        if wanted in (key, key.replace("-", "")):
            return value
    raise KvscopeError(f"unknown {what} {name!r}; choose one of {', '.join(table)}")


def model_preset(name: str) -> ModelConfig:
    """The model called ``name`` (case, spaces and underscores are ignored)."""
    return _lookup(MODELS, name, "model preset")


def device_preset(name: str) -> Device:
    """The device called ``name``, e.g. ``h100-80``, ``RTX 4090``, ``cpu``, or its
    NVML name (``NVIDIA H100 80GB HBM3``)."""
    wanted = _key(name)
    for device in DEVICES.values():
        if wanted in (_key(n) for n in device.nvml_names):
            return device
    return _lookup(DEVICES, name, "device")
