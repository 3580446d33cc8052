"""The unified memory budget, measured the way vLLM sizes its KV cache.

``memory_fraction x device memory`` is shared by four terms: weights,
activations (the peak of one forward pass at ``max_batched_tokens``),
framework overhead (CUDA context, cuBLAS workspaces, allocator slack: what
the driver says is used beyond what torch allocated) and the KV cache, which
gets the rest. On CUDA every term is measured; on the CPU the weights are
exact, the overhead is the process's resident memory beyond them, and the
activations are estimated from the shapes (a profiling pass would cost
seconds of a shared CPU for a figure the operating system does not bound).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvscope.engine.errors import KvscopeError
from kvscope.engine.model import DecoderModel
from kvscope.engine.model_config import ModelConfig
from kvscope.engine.sizing import MemoryBudget, weight_bytes


@dataclass(frozen=True, slots=True)
class BudgetTerms:
    device: str
    device_bytes: int
    memory_fraction: float
    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    activations_measured: bool
    overhead_measured: bool

    @property
    def kv_bytes(self) -> int:
        """What is left for the KV cache (negative when nothing is)."""
        usable = self.device_bytes * self.memory_fraction
        return int(usable - self.weights_bytes - self.activation_bytes - self.overhead_bytes)


def device_memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def estimate_activation_bytes(config: ModelConfig, tokens: int, logit_rows: int) -> int:
    """fp32 tensors alive at the peak of one layer: residual, normed input, QKV, gate/up,
    the SiLU product and the attention output, plus the logits of the sampled rows."""
    qkv = (config.num_q_heads + 2 * config.num_kv_heads) * config.head_dim
    per_token = 3 * config.hidden_size + qkv + 3 * config.intermediate_size
    return 4 * (tokens * per_token + logit_rows * config.vocab_size)


def profile_activation_bytes(model: DecoderModel, tokens: int, logit_rows: int, device: str) -> int:
    """Peak bytes one forward pass over ``tokens`` tokens allocates beyond what was held.

    Attention runs as plain causal SDPA over the batch as one sequence (no KV
    pages exist yet); the paged kernels' own scratch is small next to the MLP's.
    """
    dev = torch.device(device)
    cfg = model.config
    group = cfg.num_q_heads // cfg.num_kv_heads

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1).unsqueeze(0)

        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return out.squeeze(0).transpose(0, 1)

    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    held = torch.cuda.memory_allocated(dev)
    ids = torch.zeros(tokens, dtype=torch.long, device=dev)
    positions = torch.arange(tokens, device=dev) % cfg.max_position
    rows = torch.arange(min(logit_rows, tokens), device=dev)
    model.forward(ids, positions, attend, rows)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - held
    torch.cuda.empty_cache()
    return int(peak)


def measure_budget(
    model: DecoderModel, device: str, memory_fraction: float, tokens: int, logit_rows: int
) -> BudgetTerms:
    """The four terms for ``model`` on ``device`` (the KV term is what they leave)."""
    total = device_memory_bytes(device)
    weights = model.weight_bytes
    if device.startswith("cuda"):
        # Everything torch holds before this KV cache, as vLLM counts "model memory": the
        # weights, and whatever else the process already took (a loader's copy, another
        # engine), so the KV cache is sized from what is really left.
        weights = max(weights, torch.cuda.memory_allocated(torch.device(device)))
        activations = profile_activation_bytes(model, tokens, logit_rows, device)
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        overhead = max(0, (total - free) - torch.cuda.memory_reserved(torch.device(device)))
        return BudgetTerms(
            device, total, memory_fraction, weights, activations, overhead, True, True
        )
    activations = estimate_activation_bytes(model.config, tokens, logit_rows)
    rss = resident_bytes()
    overhead = 0 if rss is None else max(0, rss - weights)
    return BudgetTerms(
        device, total, memory_fraction, weights, activations, overhead, False, rss is not None
    )


def resident_bytes() -> int | None:
    """This process's resident memory (Linux), or None where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return os.sysconf("SC_PAGE_SIZE") * int(f.read().split()[1])
    except OSError:
        return None


def kv_budget_from_terms(terms: BudgetTerms) -> int:
    if terms.kv_bytes <= 0:
        gib = 2**30
        raise KvscopeError(
            f"no memory left for the KV cache: {terms.device_bytes / gib:.2f} GiB x "
            f"{terms.memory_fraction} minus {terms.weights_bytes / gib:.2f} GiB weights, "
            f"{terms.activation_bytes / gib:.2f} GiB activations and "
            f"{terms.overhead_bytes / gib:.2f} GiB overhead"
        )
    return terms.kv_bytes


def predicted_kv_bytes(config: ModelConfig, weights_dtype: str, terms: BudgetTerms) -> int:
    """What ``kvscope calc`` predicts for the same model and device (its default overhead,
    no activations): the seed note's equation, next to the measured split."""
    budget = MemoryBudget(
        memory_bytes=terms.device_bytes * terms.memory_fraction,
        weight_bytes=weight_bytes(config.num_params, weights_dtype),
    )
    return int(budget.kv_bytes)
