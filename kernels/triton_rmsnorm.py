"""RMSNorm fused with the residual add, in Triton: one launch where torch takes two to six.

A Llama layer adds each block's output to the residual stream and normalises
the sum straight away. vLLM's ``fused_add_rms_norm`` does both in one pass:
``residual += delta`` in place, and ``out = rms_norm(residual) * weight``. One
program per row reads ``delta`` and ``residual`` once, keeps the sum in
registers for the mean of squares, and writes both results. Arithmetic is in
fp32 whatever the storage dtype (as torch's CPU kernel does for bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    Delta,
    Residual,
    Weight,
    Out,
    stride_d,
    stride_r,
    stride_o,
    hidden,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(Residual + row * stride_r + offs, mask=mask, other=0).to(tl.float32)
    if HAS_DELTA:
        x += tl.load(Delta + row * stride_d + offs, mask=mask, other=0).to(tl.float32)
        tl.store(Residual + row * stride_r + offs, x.to(Residual.dtype.element_ty), mask=mask)
        # Normalise what the residual now holds (its rounding included), as torch does.
        x = x.to(Residual.dtype.element_ty).to(tl.float32)
    mean_sq = tl.sum(x * x, 0) / hidden
    w = tl.load(Weight + offs, mask=mask, other=0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(mean_sq + eps)) * w
    tl.store(Out + row * stride_o + offs, y.to(Out.dtype.element_ty), mask=mask)


def add_rms_norm_triton(
    delta: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """``residual += delta`` (in place; skipped when ``delta`` is None), then
    ``rms_norm(residual) * weight``, both ``[T, hidden]``, in one launch."""
    rows, hidden = residual.shape
    if residual.stride(-1) != 1 or (delta is not None and delta.stride(-1) != 1):
        raise ValueError("residual and delta must be contiguous along the hidden dimension")
    out = torch.empty_like(residual)
    block = triton.next_power_of_2(hidden)
    _add_rms_norm_kernel[(rows,)](
        residual if delta is None else delta, residual, weight, out,
        0 if delta is None else delta.stride(0), residual.stride(0), out.stride(0),
        hidden, eps,
        HAS_DELTA=delta is not None,
        BLOCK=block,
        num_warps=8 if block >= 4096 else 4,  # 8B's 4,096-wide rows: 16 values a thread
    )  # fmt: skip
    return out
