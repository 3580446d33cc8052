"""Attention entry points: pick a backend, run it, and report what it cost.

``auto`` means Triton on CUDA and torch on the CPU; ``triton`` on the CPU only
works in Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is
imported). Every call can report a kernel timing through ``on_kernel(name,
shape, seconds, flops, bytes)``: CUDA events on a GPU (the call then waits
for the kernel), wall clock on the CPU. FLOPs count only the (query, key)
pairs the causal mask leaves visible; bytes are what the attention must move
at least once: Q read, K/V read (payload and scales), output written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvscope.kernels.kv_quant import check_pages
from kvscope.kernels.metadata import AttentionMetadata
from kvscope.kernels.torch_paged import paged_attention_torch
from kvscope.kernels.torch_sdpa import varlen_attention_torch
from kvscope.kernels.triton_decode import paged_decode_triton
from kvscope.kernels.triton_kv import interpreting
from kvscope.kernels.triton_prefill import paged_prefill_triton, varlen_attention_triton

KernelCallback = Callable[[str, str, float, float, float], None]
BACKENDS = ("auto", "triton", "torch")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class BackendError(ValueError):
    """The requested attention backend cannot run here; the message says why."""


def resolve_backend(name: str, device: torch.device | str) -> str:
    """``"triton"`` or ``"torch"`` for a requested backend name on ``device``."""
    device = torch.device(device)
    if name == "torch":
        return "torch"
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if name != "triton":
        raise BackendError(
            f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}"
        )
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return "triton"
    raise BackendError(
        f"triton backend needs a CUDA device or TRITON_INTERPRET=1 set before triton is "
        f"imported (tensors are on {device.type})"
    )


def visible_pairs(query_lens: list[int], kv_lens: list[int], causal: bool) -> int:
    """(query, key) pairs attended, queries bottom-right aligned under a causal mask."""
    total = 0
    for q_len, kv_len in zip(query_lens, kv_lens, strict=True):
        if not causal:
            total += q_len * kv_len
        elif kv_len >= q_len:
            total += q_len * (kv_len - q_len) + q_len * (q_len + 1) // 2
        else:
            total += kv_len * (kv_len + 1) // 2
    return total


def _kv_vector_bytes(kv: torch.Tensor, scales: torch.Tensor | None) -> int:
    """Bytes one token's K (or V) for one head occupies, scales included."""
    lead = kv.dim() - 1  # payload vectors end the shape; scales add their own tail
    per_vector = kv.shape[-1] * kv.element_size()
    if scales is not None:
        per_vector += scales[(0,) * lead].numel() * scales.element_size()
    return per_vector


def _report(
    on_kernel: KernelCallback | None,
    name: str,
    device: torch.device,
    run: Callable[[], torch.Tensor],
    cost: Callable[[], tuple[str, float, float]],
) -> torch.Tensor:
    if on_kernel is None:
        return run()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = run()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        began = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - began
    shape, flops, nbytes = cost()
    on_kernel(name, shape, seconds, flops, nbytes)
    return out


def _cost(
    query_lens: list[int],
    kv_lens: list[int],
    q: torch.Tensor,
    num_kv_heads: int,
    kv_vector_bytes: int,
    causal: bool,
    kv_label: str,
) -> tuple[str, float, float]:
    total_q, num_q_heads, head_dim = q.shape
    flops = 4.0 * visible_pairs(query_lens, kv_lens, causal) * num_q_heads * head_dim
    q_and_out = 2.0 * total_q * num_q_heads * head_dim * q.element_size()
    kv_read = 2.0 * sum(kv_lens) * num_kv_heads * kv_vector_bytes
    shape = (
        f"B={len(query_lens)} q={total_q} kv={sum(kv_lens)} "
        f"heads={num_q_heads}/{num_kv_heads} D={head_dim} {kv_label}"
    )
    return shape, flops, q_and_out + kv_read


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    if out is None or out is result:
        return result
    out.copy_(result)
    return out


def paged_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    meta: AttentionMetadata,
    backend: str = "auto",
    sm_scale: float | None = None,
    kv_dtype: str | None = None,
    scales: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    on_kernel: KernelCallback | None = None,
) -> torch.Tensor:
    """The engine's attention: ragged new tokens ``q [T, Hq, D]`` over their paged K/V.

    ``kv_pages`` ``[num_pages, 2, page_size, Hkv, D']`` already holds the new
    tokens' K/V, in ``kv_dtype`` (inferred for float dtypes) with ``scales``
    for int8/int4. On Triton a decode-only batch runs the split-K decode
    kernel (``num_splits`` None: sized to the device), anything else the
    prefill kernel reading whole sequences through the page table.
    """
    plan = _paged_plan(q, kv_pages, meta, backend, sm_scale, kv_dtype, scales)
    kind, kv_dtype, scale, decode = plan.kind, plan.kv_dtype, plan.scale, plan.decode

    def run() -> torch.Tensor:
        if kind == "torch":
            return _into(out, paged_attention_torch(q, kv_pages, meta, scale, kv_dtype, scales))
        if decode:
            return paged_decode_triton(
                q, kv_pages, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len,
                kv_dtype=kv_dtype, scales=scales, sm_scale=scale,
                max_kv_len=max(meta.kv_lens), num_splits=num_splits, out=out,
            )  # fmt: skip
        return paged_prefill_triton(
            q, kv_pages, meta.cu_seqlens_q, meta.kv_indptr, meta.kv_indices,
            meta.kv_last_page_len, max(meta.query_lens),
            kv_dtype=kv_dtype, scales=scales, sm_scale=scale, out=out,
        )  # fmt: skip

    def cost() -> tuple[str, float, float]:
        if plan.cost is None:
            plan.cost = paged_attention_cost(q, kv_pages, scales, meta, kv_dtype)
        return plan.cost

    return _report(on_kernel, plan.name, q.device, run, cost)


@dataclass(slots=True)
class _PagedPlan:
    """What every layer's paged call of a step shares, worked out by the first one.

    All layers of a step call with one metadata and pages, queries and scales of one
    shape and dtype, so the backend choice, the pages' check, the kernel's name and its
    cost (shape, FLOPs, bytes) are the same figures 30 times over; the plan keeps them
    in the step's ``meta.cache`` under the call's ``signature`` (every input they
    depend on), and a call whose signature differs works them out afresh.
    """

    signature: tuple
    kind: str
    kv_dtype: str
    scale: float
    decode: bool
    name: str
    cost: tuple[str, float, float] | None = None


def _paged_plan(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    meta: AttentionMetadata,
    backend: str,
    sm_scale: float | None,
    kv_dtype: str | None,
    scales: torch.Tensor | None,
) -> _PagedPlan:
    scales_sig = None if scales is None else (scales.shape, scales.dtype)
    signature = (
        backend, sm_scale, kv_dtype, q.shape, q.dtype, q.device, kv_pages.shape,
        kv_pages.dtype, scales_sig,
    )  # fmt: skip
    plan = meta.cache.get("paged_plan")
    if plan is not None and plan.signature == signature:
        return plan
    kind = resolve_backend(backend, q.device)
    head_dim = q.shape[-1]
    checked = check_pages(kv_pages, scales, kv_dtype, head_dim)
    scale = sm_scale if sm_scale is not None else head_dim**-0.5
    decode = meta.is_decode_only
    plan = _PagedPlan(signature, kind, checked, scale, decode, paged_kernel_name(kind, meta))
    meta.cache["paged_plan"] = plan
    return plan


def paged_kernel_name(backend: str, meta: AttentionMetadata) -> str:
    """The name a paged attention call is reported under, e.g. ``triton.paged_decode``."""
    return f"{backend}.{'paged_decode' if meta.is_decode_only else 'paged_prefill'}"


def paged_attention_cost(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    scales: torch.Tensor | None,
    meta: AttentionMetadata,
    kv_dtype: str | None,
) -> tuple[str, float, float]:
    """(shape, FLOPs, bytes) of one paged attention call, as ``on_kernel`` reports them.

    Public so that a caller timing kernels its own way (the engine's CUDA events)
    counts work exactly as the kernels do.
    """
    vector = _kv_vector_bytes(kv_pages, scales)
    label = f"ps={meta.page_size} {kv_dtype}"
    return _cost(meta.query_lens, meta.kv_lens, q, kv_pages.shape[3], vector, True, label)


def paged_decode_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    sm_scale: float | None = None,
    *,
    kv_dtype: str | None = None,
    scales: torch.Tensor | None = None,
    backend: str = "auto",
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    on_kernel: KernelCallback | None = None,
) -> torch.Tensor:
    """One query token per request, ``q [B, Hq, D]``, over paged K/V; returns ``[B, Hq, D]``."""
    cu_seqlens_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    meta = AttentionMetadata.from_csr(
        cu_seqlens_q, kv_indptr, kv_indices, kv_last_page_len, kv_pages.shape[2]
    )
    return paged_attention(
        q, kv_pages, meta, backend, sm_scale, kv_dtype, scales,
        num_splits=num_splits, out=out, on_kernel=on_kernel,
    )  # fmt: skip


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = True,
    sm_scale: float | None = None,
    *,
    backend: str = "auto",
    max_seqlen_q: int | None = None,
    out: torch.Tensor | None = None,
    on_kernel: KernelCallback | None = None,
) -> torch.Tensor:
    """Ragged attention, ``q [total_q, Hq, D]`` over ``k``, ``v`` ``[total_k, Hkv, D]``.

    Causal with fewer queries than keys puts the queries last in their
    sequence (bottom-right aligned); a query that sees no key outputs zeros.
    """
    kind = resolve_backend(backend, q.device)
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    if k.dtype not in FLOAT_DTYPES or v.dtype != k.dtype:
        raise ValueError(f"k and v must share one of {FLOAT_DTYPES}, got {k.dtype} and {v.dtype}")

    def run() -> torch.Tensor:
        if kind == "torch":
            return varlen_attention_torch(
                q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, sm_scale=scale, out=out
            )
        longest = max_seqlen_q
        if longest is None:
            longest = int(cu_seqlens_q.diff().max().item())
        return varlen_attention_triton(
            q, k, v, cu_seqlens_q, cu_seqlens_k, longest, causal=causal, sm_scale=scale, out=out
        )

    def cost() -> tuple[str, float, float]:
        query_lens = cu_seqlens_q.diff().tolist()
        kv_lens = cu_seqlens_k.diff().tolist()
        vector = _kv_vector_bytes(k, None)
        label = str(k.dtype).removeprefix("torch.")
        return _cost(query_lens, kv_lens, q, k.shape[1], vector, causal, label)

    return _report(on_kernel, f"{kind}.varlen_prefill", q.device, run, cost)
