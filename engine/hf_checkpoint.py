"""Load a Hugging Face model directory (config.json + *.safetensors)."""

from __future__ import annotations

from pathlib import Path

import torch

from kvscope.engine.errors import ModelLoadError


def read_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` shard, as float32."""
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors files in {directory}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            shard = load_file(str(f))
        except Exception as exc:
            raise ModelLoadError(f"{f} is not a readable safetensors file: {exc}") from None
        weights.update({k: v.float() for k, v in shard.items()})
    return weights
