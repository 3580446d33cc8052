"""How long a replayed step would take: the roofline of its work on a device preset.

A step's time is the larger of its compute (2 x parameters FLOPs per token,
plus attention's 4 x layers x q_heads x head_dim FLOPs per token per context
token) at the device's 16-bit peak, and its memory traffic (the weights once,
plus every context token's K and V read) at the device's HBM bandwidth: the
same first-order model as ``kvscope calc`` (engine/sizing.py). Host-tier copies
add their PCIe time. ``speed`` > 1 compresses the trace's arrival times.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine.model_config import ModelConfig
from kvscope.engine.presets import Device
from kvscope.engine.sizing import WEIGHT_BYTES_PER_PARAM


@dataclass(frozen=True, slots=True)
class Roofline:
    params: float
    attn_flops_per_ctx: float  # FLOPs per (token, context token) pair
    weight_bytes: float
    kv_bytes_per_token: float
    peak_flops: float
    hbm_bytes_s: float

    @classmethod
    def of(cls, model: ModelConfig, device: Device, kv_bytes_per_token: float,
           weights_dtype: str = "bf16") -> Roofline:  # fmt: skip
        p = model.num_params
        return cls(
            params=p,
            attn_flops_per_ctx=4.0 * model.num_layers * model.num_q_heads * model.head_dim,
            weight_bytes=p * WEIGHT_BYTES_PER_PARAM[weights_dtype],
            kv_bytes_per_token=kv_bytes_per_token,
            peak_flops=device.fp16_tflops * 1e12,
            hbm_bytes_s=device.hbm_gbps * 1e9,
        )

    def step_s(self, tokens: int, ctx_pairs: float, ctx_read: float) -> float:
        """One forward over ``tokens`` new tokens attending ``ctx_pairs`` (token, context)
        pairs in all and reading ``ctx_read`` context tokens' K/V."""
        if tokens <= 0:
            return 0.0
        flops = 2.0 * self.params * tokens + self.attn_flops_per_ctx * ctx_pairs
        nbytes = self.weight_bytes + self.kv_bytes_per_token * (ctx_read + tokens)
        return max(flops / self.peak_flops, nbytes / self.hbm_bytes_s)
