"""Recompute or reload? The offload cost model.

Recomputing p cached tokens costs about 2 p P FLOPs (P parameters) at the
device's compute rate; reloading them moves their KV bytes
(2 x kv_width x layers x dtype bytes per token, kv_width = D_model / GQA)
over the host link. ``--offload auto`` offloads when the reload is cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OffloadCost:
    params: int
    kv_bytes_per_token: float
    flops_per_s: float
    link_bytes_per_s: float

    def recompute_seconds(self, tokens: int) -> float:
        return 2.0 * tokens * self.params / self.flops_per_s

    def load_seconds(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.link_bytes_per_s

    @property
    def recompute_over_load(self) -> float:
        """> 1 means reloading is cheaper than recomputing (independent of p)."""
        return self.recompute_seconds(1) / self.load_seconds(1)

    def prefer_offload(self) -> bool:
        return self.recompute_over_load > 1.0


# This 2-core CPU, measured: fp32 GEMMs reach about 50 GFLOP/s at the model's
# shapes, and a host-to-host page copy about 10 GB/s.
CPU_FLOPS = 50e9
CPU_COPY_BYTES_PER_S = 10e9
