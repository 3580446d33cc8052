"""The flags that name a model, a device and a memory budget, shared by ``kvscope calc``'s questions.

Each question asks only for what its answer needs: bytes per token need a
model's shape; a KV budget needs a device (or ``--memory-gib``) and then the
weights' size; the cliff also needs the device's FLOP/s and bandwidth.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

from kvscope.app.output_format import GIB
from kvscope.engine.attention_forms import STATE_DTYPE_BYTES
from kvscope.engine.attention_presets import SIZING_PRESETS, sizing_preset
from kvscope.engine.errors import KvscopeError
from kvscope.engine.presets import DEVICES, MODELS, Device, device_preset
from kvscope.engine.sizing import (
    KV_DTYPES,
    WEIGHT_BYTES_PER_PARAM,
    MemoryBudget,
    ModelShape,
    Residency,
    weight_bytes,
)

OVERHEAD_NOTE = "CUDA context, cuBLAS workspace and NCCL buffers cost 1-2 GiB"


# No GiB, GB/s, TFLOP/s, rate or duration a user means is this large; past it the
# arithmetic overflows to infinity and the answer would be meaningless.
MAX_FIGURE = 1e15
# Layers, heads and head_dim past 2^16 are no model's (the largest have ~128 of each);
# head_dim 10^23 had printed KV bytes per token 27 digits wide.
MAX_SHAPE = 1 << 16
MAX_KV_WIDTH = 1 << 24  # kv_heads x head_dim: 16,384 for the widest MHA model
# Tokens of a context, a request or a resident budget: 2^40 is ~8,000 times the longest
# context any model takes (2^27); --resident-tokens 1e30 had made columns 50 wide.
MAX_TOKENS = 1 << 40


def finite(text: str) -> float:
    """A float from the command line; NaN, infinity and absurd magnitudes are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    if abs(value) > MAX_FIGURE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_FIGURE:g}, got {text}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def device_name(text: str) -> str:
    """``--device``: a name, not blank (``--device ''`` had been taken as no device at all,
    a hint printed and exit 0, or "needs a device" said of a command that had one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"needs a device name, got {text!r}")
    return text


def plot_file(text: str) -> str:
    """A chart's file name: .html or .png, checked before the work that fills it (an
    empty name had written nothing and said nothing; a wrong suffix was found only
    after the whole simulation or replay)."""
    suffix = text.rsplit(".", 1)[-1].lower() if "." in text else ""
    if not text or suffix not in ("html", "htm", "png"):
        raise argparse.ArgumentTypeError(f"needs a file name ending in .html or .png, got {text!r}")
    return text


def at_most(limit: int):
    """A positive integer no larger than ``limit``: a count past it is a typo, not a plan
    (200 requests are a workload; 10^9 would only exhaust memory building it)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,}, got {text}")
        return value

    parse.__name__ = f"integer <= {limit}"
    return parse


def port(text: str) -> int:
    """A TCP port: 1-65535 (0 would pick a random one, which a user cannot then open)."""
    value = _integer(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {text}")
    return value


def non_negative(text: str) -> float:
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive(text: str) -> float:
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse_count(text: str) -> int:
    """A parameter count: ``8030261248``, ``8e9``, ``8B``, ``135M``."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(text[-1:].upper(), 1)
    try:
        value = float(text[:-1] if scale != 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (try 8e9 or 8B)") from None
    if not math.isfinite(value) or value > MAX_FIGURE:
        raise argparse.ArgumentTypeError(f"not a parameter count: {text!r} (try 8e9 or 8B)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return round(value)


def parse_residency(text: str) -> Residency:
    """``--resident-tokens``: a token count (``2048``) or a share of the context (``0.25``, ``25%``)."""
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a token count or a fraction: {text!r}") from None
    if not math.isfinite(value) or value <= 0 or (text.endswith("%") and value > 1):
        raise argparse.ArgumentTypeError(f"must be a positive count or a fraction, got {text}")
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_TOKENS:,} tokens (2^40), got {text}"
        )
    return Residency(fraction=value) if value < 1 else Residency(tokens=value)


def add_model_options(
    parser: argparse.ArgumentParser, *, kv_width: bool, kv_dtype_help: str
) -> None:
    group = parser.add_argument_group("model (one of: a preset, a file, or an explicit shape)")
    group.add_argument("--preset", help=f"model preset: {', '.join([*MODELS, *SIZING_PRESETS])}")
    group.add_argument("--config", metavar="CONFIG_JSON", help="a Hugging Face config.json")
    group.add_argument("--gguf", metavar="FILE", help="a GGUF model file (metadata only)")
    group.add_argument("--layers", type=at_most(MAX_SHAPE))
    group.add_argument("--q-heads", type=at_most(MAX_SHAPE), help="query (attention) heads")
    group.add_argument("--kv-heads", type=at_most(MAX_SHAPE))
    group.add_argument("--head-dim", type=at_most(MAX_SHAPE))
    if kv_width:
        group.add_argument(
            "--kv-width",
            type=at_most(MAX_KV_WIDTH),
            help="kv_heads x head_dim (D_model / GQA group), instead of --kv-heads/--head-dim",
        )
    group.add_argument(
        "--params", type=parse_count, help="parameter count (8e9, 8B, 135M); overrides the model's"
    )
    parser.add_argument("--kv-dtype", "--dtype", choices=list(KV_DTYPES), help=kv_dtype_help)
    parser.add_argument(
        "--state-dtype",
        choices=list(STATE_DTYPE_BYTES),
        help="linear-attention / Mamba state format (default: the KV dtype's width; vLLM's "
        "mamba_ssm_cache_dtype can keep it in fp32)",
    )
    parser.add_argument("--device", type=device_name, help=f"device preset: {', '.join(DEVICES)}")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_budget_options(parser: argparse.ArgumentParser) -> None:
    """What the KV budget is made of, and the workload that divides it (defaults: on ``calc``)."""
    group = parser.add_argument_group("memory budget (needs --device or --memory-gib)")
    group.add_argument("--memory-gib", type=positive, help="device memory (overrides --device)")
    group.add_argument("--weights-gib", type=non_negative, help="weights' size (overrides 2P)")
    group.add_argument(
        "--weight-dtype",
        choices=list(WEIGHT_BYTES_PER_PARAM),
        help="weights' format: fp16/bf16 2P bytes, int8 P, int4 P/2 (default fp16)",
    )
    group.add_argument(
        "--overhead-gib",
        type=non_negative,
        help=f"framework overhead (default 1.5; {OVERHEAD_NOTE})",
    )
    group.add_argument(
        "--activation-gib",
        type=non_negative,
        help="activation reserve for the largest forward pass (default 0)",
    )
    tokens = at_most(MAX_TOKENS)
    parser.add_argument("--input-tokens", type=tokens, help="prompt tokens (default 1024)")
    parser.add_argument("--output-tokens", type=tokens, help="output tokens (default 1024)")


# Defaults live on ``calc`` only: its subcommands parse with SUPPRESS, so flags
# given before the subcommand's name (kvscope calc --preset X cliff) keep their values.
CALC_DEFAULTS = {
    "kv_dtype": None,
    "state_dtype": None,
    "weight_dtype": "fp16",
    "overhead_gib": 1.5,
    "activation_gib": 0.0,
    "input_tokens": 1024,
    "output_tokens": 1024,
}


def resolve_model(args: argparse.Namespace) -> ModelShape:
    """The model the flags name: one of a preset, a config.json, a GGUF, or an explicit shape."""
    shape_flags = ("layers", "q_heads", "kv_heads", "head_dim", "kv_width")
    explicit = [f for f in shape_flags if getattr(args, f, None) is not None]
    sources = [s for s in ("preset", "config", "gguf") if getattr(args, s)]
    if len(sources) + bool(explicit) != 1:
        raise KvscopeError(
            "name one model: --preset NAME, --config FILE, --gguf FILE, or "
            "--layers N --q-heads N --kv-heads N --head-dim N"
        )
    if args.preset:
        shape = sizing_preset(args.preset)
    elif args.config:
        shape = ModelShape.from_hf_config(args.config)
    elif args.gguf:
        shape = ModelShape.from_gguf(args.gguf)
    else:
        shape = _explicit_shape(args)
    return replace(shape, params=args.params) if args.params else shape


def _explicit_shape(args: argparse.Namespace) -> ModelShape:
    width = getattr(args, "kv_width", None)
    if width is not None:
        if args.kv_heads is not None or args.head_dim is not None:
            raise KvscopeError("give --kv-width or --kv-heads with --head-dim, not both")
        kv_heads, head_dim = 1, width
    else:
        kv_heads, head_dim = args.kv_heads, args.head_dim
    q_heads = args.q_heads if width is None else args.q_heads or kv_heads
    missing = [
        flag
        for flag, value in (
            ("--layers", args.layers),
            ("--q-heads", q_heads),
            ("--kv-heads", kv_heads),
            ("--head-dim", head_dim),
        )
        if value is None
    ]
    if missing:
        raise KvscopeError(f"an explicit model shape also needs {' '.join(missing)}")
    return ModelShape("custom", args.layers, q_heads, kv_heads, head_dim)


def device_arg(args: argparse.Namespace) -> Device | None:
    return device_preset(args.device) if args.device else None


def memory_budget(
    args: argparse.Namespace, shape: ModelShape, *, needed_for: str | None = None
) -> MemoryBudget | None:
    """The device's memory less weights, overhead and activations.

    None when no device is named and the question (``needed_for`` is None) does
    not need one; the weights are asked for only once a device is.
    """
    device = device_arg(args)
    memory_gib = args.memory_gib or (device.memory_gib if device else None)
    if memory_gib is None:
        if needed_for is None:
            _refuse_budget_flags(args)
            return None
        raise KvscopeError(f"{needed_for} needs a device: --device NAME or --memory-gib N")
    if args.weights_gib is not None:
        weights = args.weights_gib * GIB
    elif shape.params:
        weights = weight_bytes(shape.params, args.weight_dtype)
    else:
        raise KvscopeError(
            "the KV budget needs the weights' size: the model's parameter count is unknown, "
            "give --params or --weights-gib"
        )
    return MemoryBudget(
        memory_bytes=round(memory_gib * GIB),
        weight_bytes=round(weights),
        overhead_bytes=round(args.overhead_gib * GIB),
        activation_bytes=round(args.activation_gib * GIB),
    )


# The flags that only shape a budget, as ``add_budget_options`` names them.
BUDGET_FLAGS = {
    "weights_gib": "--weights-gib",
    "weight_dtype": "--weight-dtype",
    "overhead_gib": "--overhead-gib",
    "activation_gib": "--activation-gib",
}


def _refuse_budget_flags(args: argparse.Namespace) -> None:
    """Without a device there is no budget, so its flags would change nothing: say so
    rather than print figures that silently ignore them (``--weights-gib 16`` had)."""
    given = [
        flag
        for name, flag in BUDGET_FLAGS.items()
        if getattr(args, name, None) != CALC_DEFAULTS.get(name)
    ]
    if given:
        need = "needs" if len(given) == 1 else "need"
        raise KvscopeError(
            f"{' and '.join(given)} {need} a device for the KV budget: "
            "add --device NAME or --memory-gib N"
        )


def budget_figures(args: argparse.Namespace, budget: MemoryBudget) -> dict[str, Any]:
    device = device_arg(args)
    return {
        "device": device.name if device else None,
        "memory_bytes": budget.memory_bytes,
        "weight_dtype": None if args.weights_gib is not None else args.weight_dtype,
        "weights_bytes": budget.weight_bytes,
        "overhead_bytes": budget.overhead_bytes,
        "activation_bytes": budget.activation_bytes,
        "kv_budget_bytes": budget.kv_bytes,
        "fits": budget.spare_bytes > 0,
    }


def gib_text(n: float) -> str:
    return f"{n / GIB:,.2f}"


def memory_rows(r: dict[str, Any]) -> list[list[str]]:
    weights = f"weights ({r['weight_dtype']})" if r["weight_dtype"] else "weights"
    return [
        ["device memory", gib_text(r["memory_bytes"]), ""],
        [f"- {weights}", gib_text(r["weights_bytes"]), ""],
        ["- framework overhead", gib_text(r["overhead_bytes"]), OVERHEAD_NOTE],
        ["- activation reserve", gib_text(r["activation_bytes"]), ""],
        ["= KV budget", gib_text(r["kv_budget_bytes"]), "" if r["fits"] else "does not fit"],
    ]
