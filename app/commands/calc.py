"""``kvscope calc``: how much KV cache a model gets on a device, and how many requests fit.

``kvscope calc offload`` answers the follow-up: is it cheaper to reload an
evicted prefix's KV over PCIe or to recompute it? The math lives in
``engine/sizing.py``; this module resolves flags and presets and prints.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from typing import Any

from engine.errors import KvscopeError
from engine.presets import DEVICES, MODELS, Device, device_preset, model_preset
from engine.sizing import (
    GIB,
    KV_FORMATS,
    WEIGHT_BYTES_PER_PARAM,
    MemoryBudget,
    ModelShape,
    avg_tokens_held,
    kv_capacity,
    reload_cost,
    weight_bytes,
)

OVERHEAD_NOTE = "CUDA context, cuBLAS workspace and NCCL buffers cost 1-2 GiB"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive(text: str) -> float:
    value = float(text)
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
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return round(value)


def _add_model_options(parser: argparse.ArgumentParser, *, kv_width: bool) -> None:
    group = parser.add_argument_group("model (one of: a preset, a file, or an explicit shape)")
    group.add_argument("--preset", help=f"model preset: {', '.join(MODELS)}")
    group.add_argument("--config", metavar="CONFIG_JSON", help="a Hugging Face config.json")
    group.add_argument("--gguf", metavar="FILE", help="a GGUF model file (metadata only)")
    group.add_argument("--layers", type=positive_int)
    group.add_argument("--q-heads", type=positive_int, help="query (attention) heads")
    group.add_argument("--kv-heads", type=positive_int)
    group.add_argument("--head-dim", type=positive_int)
    if kv_width:
        group.add_argument(
            "--kv-width",
            type=positive_int,
            help="kv_heads x head_dim (D_model / GQA group), instead of --kv-heads/--head-dim",
        )
    group.add_argument(
        "--params", type=parse_count, help="parameter count (8e9, 8B, 135M); overrides the model's"
    )
    parser.add_argument(
        "--kv-dtype",
        "--dtype",
        default="fp16",
        choices=list(KV_FORMATS),
        help="KV cache element format (default fp16)",
    )
    parser.add_argument("--device", help=f"device preset: {', '.join(DEVICES)}")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calc",
        help="size the KV cache: bytes per token, budget, batch that fits",
        description="KV-cache sizing for a model on a device. Units: GiB = 2^30 bytes.",
    )
    _add_model_options(parser, kv_width=False)
    parser.add_argument("--memory-gib", type=positive, help="device memory (overrides --device)")
    parser.add_argument("--weights-gib", type=non_negative, help="weights' size (overrides 2P)")
    parser.add_argument(
        "--weight-dtype",
        default="fp16",
        choices=list(WEIGHT_BYTES_PER_PARAM),
        help="weights' format: fp16/bf16 2P bytes, int8 P, int4 P/2 (default fp16)",
    )
    parser.add_argument(
        "--overhead-gib",
        type=non_negative,
        default=1.5,
        help=f"framework overhead (default 1.5; {OVERHEAD_NOTE})",
    )
    parser.add_argument(
        "--activation-gib",
        type=non_negative,
        default=0.0,
        help="activation reserve for the largest forward pass (default 0)",
    )
    parser.add_argument("--input-tokens", type=positive_int, default=1024)
    parser.add_argument("--output-tokens", type=positive_int, default=1024)
    parser.add_argument(
        "--max-model-len",
        type=positive_int,
        help="tokens each request reserves under max-length reservation (default: the model's context)",
    )
    parser.add_argument(
        "--seq-len", type=positive_int, help="with --batch: KV bytes of B x S tokens"
    )
    parser.add_argument("--batch", type=positive_int, help="sequences for --seq-len (default 1)")
    parser.set_defaults(handler=run_calc)

    what = parser.add_subparsers(dest="calc_what", metavar="[offload]")
    # SUPPRESS: flags given before "offload" (kvscope calc --preset X offload) keep their values.
    offload = what.add_parser(
        "offload",
        argument_default=argparse.SUPPRESS,
        help="recompute or reload evicted KV? T_recompute / T_load",
        description="T_recompute / T_load = (bandwidth x P) / (dtype x (D_model/GQA) x L x compute).",
    )
    _add_model_options(offload, kv_width=True)
    offload.add_argument("--pcie-gbps", type=positive, help="host-device GB/s (overrides --device)")
    offload.add_argument("--tflops", type=positive, help="compute TFLOP/s (overrides --device)")
    offload.set_defaults(handler=run_offload)


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
        shape = ModelShape.from_config(model_preset(args.preset))
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


def _device(args: argparse.Namespace) -> Device | None:
    return device_preset(args.device) if args.device else None


def _plain(value: float) -> int | float:
    """Integral floats as ints, so JSON says 131072, not 131072.0."""
    return int(value) if float(value).is_integer() else value


def _plain_dict(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) if isinstance(v, float) else v for k, v in figures.items()}


def sizing_report(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure ``kvscope calc`` prints, as one JSON-ready dict (bytes unless named)."""
    shape = resolve_model(args)
    device = _device(args)
    memory_gib = args.memory_gib or (device.memory_gib if device else None)
    if memory_gib is None:
        raise KvscopeError("name a device: --device NAME or --memory-gib N")
    if args.weights_gib is not None:
        weights = args.weights_gib * GIB
    elif shape.params:
        weights = weight_bytes(shape.params, args.weight_dtype)
    else:
        raise KvscopeError("the model's parameter count is unknown: give --params or --weights-gib")
    if args.batch is not None and args.seq_len is None:
        raise KvscopeError("--batch needs --seq-len")
    budget = MemoryBudget(
        memory_bytes=round(memory_gib * GIB),
        weight_bytes=round(weights),
        overhead_bytes=round(args.overhead_gib * GIB),
        activation_bytes=round(args.activation_gib * GIB),
    )
    avg_tokens = avg_tokens_held(args.input_tokens, args.output_tokens)
    max_len = args.max_model_len or shape.context_len or args.input_tokens + args.output_tokens

    def capacity(variant: ModelShape, kv_dtype: str) -> dict[str, Any]:
        figures = asdict(
            kv_capacity(budget.kv_bytes, variant.bytes_per_token(kv_dtype), avg_tokens, max_len)
        )
        return _plain_dict(figures)

    report: dict[str, Any] = {
        "units": "bytes; GiB = 2^30 bytes",
        "model": _plain_dict(asdict(shape)),
        "device": device.name if device else None,
        "memory_bytes": budget.memory_bytes,
        "weight_dtype": None if args.weights_gib is not None else args.weight_dtype,
        "weights_bytes": budget.weight_bytes,
        "overhead_bytes": budget.overhead_bytes,
        "activation_bytes": budget.activation_bytes,
        "kv_budget_bytes": budget.kv_bytes,
        "fits": budget.spare_bytes > 0,
        "kv_dtype": args.kv_dtype,
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "avg_tokens_per_request": avg_tokens,
        "max_model_len": max_len,
        **capacity(shape, args.kv_dtype),
        "by_kv_heads": {
            label: {"kv_heads": variant.kv_heads, **capacity(variant, args.kv_dtype)}
            for label, variant in shape.kv_head_variants().items()
        },
        "by_kv_dtype": {name: capacity(shape, name) for name in KV_FORMATS},
    }
    if args.seq_len is not None:
        batch = args.batch or 1
        report |= {
            "seq_len": args.seq_len,
            "batch": batch,
            "kv_bytes_total": shape.bytes_per_token(args.kv_dtype) * args.seq_len * batch,
        }
    return _plain_dict(report)


def offload_report(args: argparse.Namespace) -> dict[str, Any]:
    """The recompute-vs-reload figures of ``kvscope calc offload``."""
    shape = resolve_model(args)
    if not shape.params:
        raise KvscopeError("the model's parameter count is unknown: give --params")
    device = _device(args)
    pcie = getattr(args, "pcie_gbps", None) or (device.pcie_gbps if device else None)
    tflops = getattr(args, "tflops", None) or (device.fp16_tflops if device else None)
    if pcie is None or tflops is None:
        raise KvscopeError("name a device (--device NAME) or give --pcie-gbps and --tflops")
    per_token = shape.bytes_per_token(args.kv_dtype)
    cost = reload_cost(shape.params, per_token, pcie, tflops)
    return _plain_dict(
        {
            "model": _plain_dict(asdict(shape)),
            "device": device.name if device else None,
            "params": shape.params,
            "kv_dtype": args.kv_dtype,
            "kv_width": shape.kv_width,
            "layers": shape.layers,
            "kv_bytes_per_token": per_token,
            "pcie_gbps": pcie,
            "tflops": tflops,
            "recompute_s_per_token": cost.recompute_s,
            "load_s_per_token": cost.load_s,
            "recompute_over_load": cost.recompute_over_load,
        }
    )


def format_table(rows: list[list[str]], header: list[str] | None = None) -> str:
    """Columns padded to a common width; columns of numbers are right-aligned."""
    lines = [header, *rows] if header else rows
    columns = list(zip(*lines, strict=True))
    widths = [max(map(len, column)) for column in columns]
    numeric = [
        i > 0 and all(c[:1].isdigit() or c[:1] == "-" for c in column[bool(header) :] if c)
        for i, column in enumerate(columns)
    ]
    return "\n".join(
        "  ".join(
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(line, widths, numeric, strict=True)
        ).rstrip()
        for line in lines
    )


def human_bytes(n: float) -> str:
    """Binary units: 131072 -> '128 KiB', 201326592 -> '192 MiB'."""
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n:,.0f} B"


def _count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f}"


def _print_sizing(r: dict[str, Any]) -> None:
    m = r["model"]
    params = f", {_params(m['params'])} params" if m["params"] else ""
    print(
        f"{m['name']}: {m['layers']} layers, {m['q_heads']} query heads, {m['kv_heads']} KV heads, "
        f"head_dim {m['head_dim']}{params}"
    )
    print(
        f"{r['device'] or 'device'} ({r['memory_bytes'] / GIB:g} GiB), KV {r['kv_dtype']}, "
        f"{r['input_tokens']:,} in / "
        f"{r['output_tokens']:,} out. Units: GiB = 2^30 bytes.\n"
    )
    weights = f"weights ({r['weight_dtype']})" if r["weight_dtype"] else "weights"
    memory = [
        ["device memory", _gib(r["memory_bytes"]), ""],
        [f"- {weights}", _gib(r["weights_bytes"]), ""],
        ["- framework overhead", _gib(r["overhead_bytes"]), OVERHEAD_NOTE],
        ["- activation reserve", _gib(r["activation_bytes"]), ""],
        ["= KV budget", _gib(r["kv_budget_bytes"]), "" if r["fits"] else "does not fit"],
    ]
    print(format_table(memory, ["memory", "GiB", ""]) + "\n")
    per = r["kv_bytes_per_token"]
    kv = [
        ["KV bytes per token", _count(per), human_bytes(per)],
        ["average tokens per request", _count(r["avg_tokens_per_request"]), "input + output/2"],
        [
            "KV bytes per request",
            _count(r["kv_bytes_per_request"]),
            human_bytes(r["kv_bytes_per_request"]),
        ],
        ["max average batch", _count(r["max_avg_batch"]), ""],
        [
            "batch under max reservation",
            _count(r["max_batch_max_reservation"]),
            f"{r['max_model_len']:,} tokens each",
        ],
        ["tokens in budget", _count(r["tokens_in_budget"]), ""],
    ]
    if "kv_bytes_total" in r:
        total = r["kv_bytes_total"]
        kv.append(
            [f"KV for {r['batch']} x {r['seq_len']:,} tokens", _count(total), human_bytes(total)]
        )
    print(format_table(kv, ["KV cache", "", ""]) + "\n")
    columns = ["bytes/token", "max avg batch", "max-len batch", "tokens in budget"]

    def row(label: str, c: dict[str, Any], *extra: str) -> list[str]:
        figures = (
            "kv_bytes_per_token",
            "max_avg_batch",
            "max_batch_max_reservation",
            "tokens_in_budget",
        )
        return [label, *extra, *(_count(c[f]) for f in figures)]

    heads = [row(k, c, str(c["kv_heads"])) for k, c in r["by_kv_heads"].items()]
    print(format_table(heads, ["attention", "KV heads", *columns]) + "\n")
    dtypes = [row(k, c) for k, c in r["by_kv_dtype"].items()]
    print(format_table(dtypes, ["KV dtype", *columns]))


def run_calc(args: argparse.Namespace) -> int:
    report = sizing_report(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_sizing(report)
    return 0


def run_offload(args: argparse.Namespace) -> int:
    r = offload_report(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    rows = [
        ["parameters", _params(r["params"])],
        ["KV width x layers", f"{r['kv_width']:,} x {r['layers']}"],
        [f"KV bytes per token ({r['kv_dtype']})", _count(r["kv_bytes_per_token"])],
        ["PCIe GB/s", _count(r["pcie_gbps"])],
        ["compute TFLOP/s", _count(r["tflops"])],
        ["recompute, s/token (2P FLOPs)", f"{r['recompute_s_per_token']:.3g}"],
        ["reload, s/token", f"{r['load_s_per_token']:.3g}"],
        ["T_recompute / T_load", f"{r['recompute_over_load']:.1f}"],
    ]
    print(format_table(rows, [r["model"]["name"], ""]))
    ratio = r["recompute_over_load"]
    verdict = (
        f"reloading is {ratio:.1f}x cheaper than recomputing"
        if ratio >= 1
        else f"recomputing is {1 / ratio:.1f}x cheaper than reloading"
    )
    print(f"\n{verdict}")
    return 0
