"""Attention kernels for kvscope: Triton FlashAttention-2 prefill and split-K
paged decode, their torch reference and CPU paths, KV quantization formats,
and backend selection with per-call timing. Imports nothing from the engine.
"""

from __future__ import annotations

from kvscope.kernels.backend import (
    BackendError,
    flash_attention_varlen,
    paged_attention,
    paged_decode_attention,
    resolve_backend,
)
from kvscope.kernels.kv_quant import KVPages, dequantize, quantize
from kvscope.kernels.metadata import AttentionMetadata
from kvscope.kernels.torch_paged import paged_attention_torch

__all__ = [
    "AttentionMetadata",
    "BackendError",
    "KVPages",
    "dequantize",
    "flash_attention_varlen",
    "paged_attention",
    "paged_attention_torch",
    "paged_decode_attention",
    "quantize",
    "resolve_backend",
]
