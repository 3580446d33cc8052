"""How one KV element is stored, per format: its payload bits and the scales it pays."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine.errors import KvscopeError


@dataclass(frozen=True, slots=True)
class KVFormat:
    """How one KV element is stored: its payload bits and its scale overhead.

    ``scale_bytes`` are paid once per ``group`` elements along head_dim
    (``group=0`` means one scale per token per head, i.e. per head_dim elements).
    """

    name: str
    bits: int
    scale_bytes: int = 0
    group: int = 0

    def bytes_per_head_vector(self, head_dim: int) -> float:
        payload = head_dim * self.bits / 8
        if not self.scale_bytes:
            return payload
        groups = 1 if self.group == 0 else head_dim // self.group
        return payload + groups * self.scale_bytes


KV_DTYPES: dict[str, KVFormat] = {
    "fp32": KVFormat("fp32", 32),
    "fp16": KVFormat("fp16", 16),
    "bf16": KVFormat("bf16", 16),
    "fp8_e4m3": KVFormat("fp8_e4m3", 8),
    "fp8_e5m2": KVFormat("fp8_e5m2", 8),
    # per-token-per-head fp32 scale
    "int8": KVFormat("int8", 8, scale_bytes=4),
    # group-wise over head_dim (group 32): fp16 scale + fp16 zero point per group
    "int4": KVFormat("int4", 4, scale_bytes=4, group=32),
}


def kv_dtype_spec(name: str) -> KVFormat:
    try:
        return KV_DTYPES[name]
    except KeyError:
        raise KvscopeError(
            f"unknown KV dtype {name!r}; choose one of {', '.join(KV_DTYPES)}"
        ) from None
