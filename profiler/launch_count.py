"""Kernel launches of one decode step on the CUDA path, counted on the CPU.

A GPU step launches one kernel per torch op that computes (views and
allocations launch nothing) plus one per Triton kernel; inside a CUDA graph
each still costs about 2 us, so the count per layer is a cost a CPU run can
measure and a test can hold. ``count_step`` runs one batch-1 decode step as
the CUDA engine would (Triton attention, the fused Triton kernels, on the
CPU under Triton's interpreter: ``TRITON_INTERPRET=1`` must be set before
triton is imported) and counts with a ``TorchDispatchMode`` plus a hook on
the interpreter's kernel calls. bench/launch_count.py prints the table;
tests/test_launch_count.py holds the count.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Ops that launch nothing although they return fresh memory (allocations), and the
# host read of a scalar (a sync, not a kernel).
_NO_LAUNCH = {"empty", "empty_strided", "empty_like", "new_empty", "_local_scalar_dense"}


class LaunchCounter(TorchDispatchMode):
    """Counts the torch ops that would each be a CUDA kernel, and the Triton launches."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if not self.paused and _launches(func, args, out):
            self.ops[func.overloadpacket.__name__] += 1
        return out

    def triton(self, name: str) -> None:
        if not self.paused:
            self.ops[f"triton:{name}"] += 1

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _launches(func, args, out) -> bool:  # noqa: ANN001
    """Whether ``func`` computed something: it wrote in place, or made new memory."""
    if func.overloadpacket.__name__ in _NO_LAUNCH:
        return False
    if func._schema.is_mutable:
        return True
    # oneDNN's packed weights (bf16 on the CPU, engine/model.py Projection) are opaque:
    # they have no storage to compare, and no op hands one back.
    inputs = {
        a.untyped_storage().data_ptr()
        for a in tree_leaves(args)
        if isinstance(a, torch.Tensor) and not a.is_mkldnn
    }
    outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
    # Views and no-op casts hand back memory an input already owns: nothing ran.
    return any(o.untyped_storage().data_ptr() not in inputs for o in outs)


_ACTIVE: list[LaunchCounter] = []  # the counter the interpreter hook reports to


def _hook_triton() -> None:
    """Count each interpreted kernel launch once; the interpreter's own torch copies don't count."""
    from triton.runtime.interpreter import InterpretedFunction

    if getattr(InterpretedFunction.run, "counted", False):
        return
    original = InterpretedFunction.run

    def run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        counter = _ACTIVE[-1] if _ACTIVE else None
        if counter is None:
            return original(self, *args, **kwargs)
        counter.triton(getattr(self.fn, "__name__", "kernel"))
        counter.paused += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            counter.paused -= 1

    run.counted = True
    InterpretedFunction.run = run


def count_step(
    config,
    weights_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    context: int = 32,
    path: str = "cuda",
) -> Counter[str]:
    """Launches of one batch-1 decode step of ``config`` (a ModelConfig) on the CUDA path
    (fused kernels, Triton attention) or the CPU's (``path="cpu"``: torch ops throughout)."""
    from kvscope.engine.dummy import load_dummy
    from kvscope.engine.kv_storage import KVStorage
    from kvscope.engine.model import DecoderModel
    from kvscope.kernels import AttentionMetadata, paged_attention

    loaded = load_dummy(config, weights_dtype, "cpu")
    params = inspect.signature(DecoderModel).parameters
    extra = {"fused": path == "cuda"} if "fused" in params else {}
    backend = "triton" if path == "cuda" else "torch"
    model = DecoderModel(config, loaded.weights, weights_dtype, "cpu", **extra)
    del loaded
    gc.collect()
    page_size = 16
    pages = -(-context // page_size)
    storage = KVStorage(
        config.num_layers, pages, page_size, config.num_kv_heads, config.head_dim, kv_dtype
    )
    meta = AttentionMetadata.build([list(range(pages))], [1], [context], page_size)
    slots = torch.tensor([context - 1])
    positions = torch.tensor([context - 1])
    token_ids = torch.tensor([1])
    rows = torch.tensor([0])

    def attend(layer: int, q: torch.Tensor, k, v) -> torch.Tensor:  # noqa: ANN001
        kv_pages = storage.layer(layer)
        if k is not None:
            kv_pages.write(slots, k, v)
        return paged_attention(
            q, kv_pages.data, meta, backend, kv_dtype=kv_pages.kv_dtype, scales=kv_pages.scales
        )

    takes_kv = "kv" in inspect.signature(model.forward).parameters
    step = {"kv": storage.step(slots)} if takes_kv else {}
    model.forward(token_ids, positions, attend, rows, **step)  # warm-up (metadata caches)
    counter = LaunchCounter()
    _hook_triton()
    step = {"kv": storage.step(slots)} if takes_kv else {}
    _ACTIVE.append(counter)
    try:
        with counter:
            model.forward(token_ids, positions, attend, rows, **step)
    finally:
        _ACTIVE.pop()
    return counter.ops


def measure(model: str, weights_dtype: str, kv_dtype: str, path: str = "cuda") -> dict:
    from kvscope.engine.dummy import dummy_config

    base = dummy_config(model)
    counts = {}
    for layers in (1, 2):
        counts[layers] = count_step(
            dataclasses.replace(base, num_layers=layers), weights_dtype, kv_dtype, path=path
        )
        gc.collect()
    per_layer = counts[2].copy()
    per_layer.subtract(counts[1])
    return {
        "model": base.name,
        "per_layer": sum(per_layer.values()),
        "per_step_rest": sum(counts[1].values()) - sum(per_layer.values()),
        "layer_ops": {k: v for k, v in sorted(per_layer.items()) if v},
    }
