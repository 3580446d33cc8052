"""SiLU-and-multiply in Triton: the MLP's ``silu(gate) * up`` in one launch, not two.

The fused gate-up projection returns ``[T, 2 * I]`` (gate then up); one
program per (row, block of columns) reads both halves once and writes
``[T, I]``. Arithmetic in fp32, stored in the input's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(GateUp, Out, stride_g, stride_o, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(GateUp + row * stride_g + offs, mask=mask, other=0).to(tl.float32)
    up = tl.load(GateUp + row * stride_g + inter + offs, mask=mask, other=0).to(tl.float32)
    # Round silu(gate) to the storage dtype before the product, as torch's two ops do.
    act = (gate / (1.0 + tl.exp(-gate))).to(Out.dtype.element_ty).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (act * up).to(Out.dtype.element_ty), mask=mask)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[T, 2 * I]``; returns ``[T, I]``."""
    rows, width = gate_up.shape
    if width % 2 or gate_up.stride(-1) != 1:
        raise ValueError("gate_up must be [T, 2 * I], contiguous along its last dimension")
    inter = width // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block
    )
    return out
