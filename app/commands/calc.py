"""``kvscope calc``: how much KV cache a model gets on a device, and how many requests fit.

Bytes per token need only the model's shape; a device (``--device`` or
``--memory-gib``) adds the budget and the batches that fit. ``kvscope calc
offload`` answers the follow-up: is it cheaper to reload an evicted prefix's KV
over PCIe or to recompute it? ``kvscope calc cliff`` (``app/cliff.py``): past
which context length the batch the budget holds falls below the batch that
keeps the device compute-bound. The math lives in ``engine/sizing.py``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from kvscope.app.cliff import CLIFF_DESCRIPTION, run_cliff
from kvscope.app.output_format import GIB, count_text, format_table, human_bytes, plain_dict
from kvscope.app.sizing_args import (
    CALC_DEFAULTS,
    MAX_TOKENS,
    add_budget_options,
    add_model_options,
    at_most,
    budget_figures,
    device_arg,
    memory_budget,
    memory_rows,
    parse_residency,
    plot_file,
    positive,
    resolve_model,
)
from kvscope.engine.attention_forms import WINDOWED, request_bytes
from kvscope.engine.errors import KvscopeError
from kvscope.engine.sizing import (
    KV_DTYPES,
    ModelShape,
    avg_tokens_held,
    reload_cost,
    shape_capacity,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calc",
        help="size the KV cache: bytes per token, budget, batch that fits",
        description="KV-cache sizing for a model, and on a device (--device or --memory-gib) "
        "the budget and the batch that fits. Units: GiB = 2^30 bytes.",
    )
    add_model_options(
        parser, kv_width=False, kv_dtype_help="KV cache element format (default fp16)"
    )
    add_budget_options(parser)
    tokens = at_most(MAX_TOKENS)  # a count past 2^40 tokens is a typo, and a table 40 digits wide
    parser.add_argument(
        "--max-model-len",
        type=tokens,
        help="tokens each request reserves under max-length reservation (default: the model's context)",
    )
    parser.add_argument("--seq-len", type=tokens, help="with --batch: KV bytes of B x S tokens")
    parser.add_argument("--batch", type=tokens, help="sequences for --seq-len (default 1)")
    parser.set_defaults(handler=run_calc, **CALC_DEFAULTS)

    what = parser.add_subparsers(dest="calc_what", metavar="[offload|cliff]")
    offload = what.add_parser(
        "offload",
        argument_default=argparse.SUPPRESS,
        help="recompute or reload evicted KV? T_recompute / T_load",
        description="T_recompute / T_load = (bandwidth x P) / (dtype x (D_model/GQA) x L x compute).",
    )
    add_model_options(
        offload, kv_width=True, kv_dtype_help="KV cache element format (default fp16)"
    )
    offload.add_argument("--pcie-gbps", type=positive, help="host-device GB/s (overrides --device)")
    offload.add_argument("--tflops", type=positive, help="compute TFLOP/s (overrides --device)")
    offload.set_defaults(handler=_reading_its_flags("offload", run_offload))

    cliff = what.add_parser(
        "cliff",
        argument_default=argparse.SUPPRESS,
        help="the context length past which the KV budget cannot hold a compute-bound batch",
        description=CLIFF_DESCRIPTION,
    )
    add_model_options(
        cliff,
        kv_width=False,
        kv_dtype_help="quantized KV format to compare with fp16 (default fp8_e4m3)",
    )
    add_budget_options(cliff)
    cliff.add_argument("--tflops", type=positive, help="dense 16-bit TFLOP/s (overrides --device)")
    cliff.add_argument("--hbm-gbps", type=positive, help="memory GB/s (overrides --device)")
    cliff.add_argument(
        "--resident-tokens",
        type=parse_residency,
        metavar="N|F",
        help="InfLLM: tokens per request kept resident (2048), or a share of its context "
        "(0.25 or 25%%); the rest lives in the host tier",
    )
    cliff.add_argument(
        "--max-context",
        type=tokens,
        help="longest context in the table and the plot (default 131072)",
    )
    cliff.add_argument(
        "--plot", metavar="FILE", type=plot_file, help="write the curves to FILE.html (or .png)"
    )
    cliff.set_defaults(handler=_reading_its_flags("cliff", run_cliff))


# calc's own flags that a subcommand does not read. Given before the subcommand they reach
# its namespace (the subcommands' defaults are SUPPRESS, so the model flags carry over),
# and `calc --weights-gib 30 offload` had ignored them silently.
_UNREAD = {
    "offload": ("memory_gib", "weights_gib", "weight_dtype", "overhead_gib", "activation_gib",
                "input_tokens", "output_tokens", "max_model_len", "seq_len", "batch"),
    "cliff": ("max_model_len", "seq_len", "batch"),
}  # fmt: skip


def _reading_its_flags(what: str, handler: Callable[[argparse.Namespace], int]):
    """``handler``, after refusing calc's flags that ``calc what`` would ignore."""

    def checked(args: argparse.Namespace) -> int:
        given = [
            "--" + name.replace("_", "-")
            for name in _UNREAD[what]
            if getattr(args, name, None) not in (None, CALC_DEFAULTS.get(name))
        ]
        if given:
            verb = "does" if len(given) == 1 else "do"
            raise KvscopeError(f"{', '.join(given)} {verb} not apply to calc {what}")
        return handler(args)

    return checked


def sizing_report(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure ``kvscope calc`` prints, as one JSON-ready dict (bytes unless named).

    Bytes per token and per request need only the model's shape; the budget and
    the batches that fit are added when a device (or --memory-gib) is named.
    """
    shape = resolve_model(args)
    if args.batch is not None and args.seq_len is None:
        raise KvscopeError("--batch needs --seq-len")
    kv_dtype = args.kv_dtype or "fp16"
    budget = memory_budget(args, shape)
    # --seq-len: every request holds that many tokens, and every figure says so.
    if args.seq_len is not None:
        avg_tokens = float(args.seq_len)
    else:
        avg_tokens = avg_tokens_held(args.input_tokens, args.output_tokens)
    max_len = args.max_model_len or shape.context_len or args.input_tokens + args.output_tokens

    state_dtype = getattr(args, "state_dtype", None)

    def per_request(variant: ModelShape, dtype: str) -> float:
        if args.seq_len is not None:
            return variant.request_bytes(args.seq_len, dtype, state_dtype)
        return variant.avg_request_bytes(args.input_tokens, args.output_tokens, dtype, state_dtype)

    def capacity(variant: ModelShape, dtype: str) -> dict[str, Any]:
        request = per_request(variant, dtype)
        if budget is None:
            figures = {
                "kv_bytes_per_token": variant.bytes_per_token(dtype),
                "kv_bytes_per_request": request,
            }
        else:
            figures = asdict(
                shape_capacity(variant, budget.kv_bytes, dtype, request, max_len, state_dtype)
            )
        return plain_dict(figures)

    def groups(dtype: str) -> list[dict[str, Any]]:
        """Each layer group's bytes per held token and per request, and its share."""
        if args.seq_len is not None:
            requests = [request_bytes((g,), args.seq_len, dtype, state_dtype) for g in shape.groups]
        else:
            requests = shape.group_avg_request_bytes(
                args.input_tokens, args.output_tokens, dtype, state_dtype
            )
        total = sum(requests)
        rows = []
        for g, request in zip(shape.groups, requests, strict=True):
            rows.append(
                {
                    "kind": g.kind,
                    "label": g.label,
                    "layers": g.layers,
                    "window": g.window,
                    "kv_bytes_per_token": g.bytes_per_token(dtype),
                    "state_bytes_per_request": g.state_bytes(dtype, state_dtype),
                    "kv_bytes_per_request": request,
                    "share_of_request": request / total if total else None,
                }  # fmt: skip
            )
        return rows

    report: dict[str, Any] = {
        "units": "bytes; GiB = 2^30 bytes",
        "model": plain_dict(asdict(shape)),
        **(budget_figures(args, budget) if budget else {"device": None}),
        "kv_dtype": kv_dtype,
        # Not used when --seq-len sets the tokens each request holds.
        "input_tokens": args.input_tokens if args.seq_len is None else None,
        "output_tokens": args.output_tokens if args.seq_len is None else None,
        "avg_tokens_per_request": avg_tokens,
        **({"max_model_len": max_len} if budget else {}),
        **capacity(shape, kv_dtype),
        "state_dtype": state_dtype,
        "groups": groups(kv_dtype),
        # MHA/GQA/MQA compare K and V per head: nothing to compare in MLA or state layers.
        "by_kv_heads": {
            label: {"kv_heads": variant.kv_heads, **capacity(variant, kv_dtype)}
            for label, variant in shape.kv_head_variants().items()
        }
        if any(g.kind in ("full", *WINDOWED) for g in shape.groups)
        else {},
        "by_kv_dtype": {name: capacity(shape, name) for name in KV_DTYPES},
    }
    if args.seq_len is not None:
        batch = args.batch or 1
        report |= {
            "seq_len": args.seq_len,
            "batch": batch,
            "kv_bytes_total": shape.request_bytes(args.seq_len, kv_dtype, state_dtype) * batch,
        }
    return plain_dict(report)


def offload_report(args: argparse.Namespace) -> dict[str, Any]:
    """The recompute-vs-reload figures of ``kvscope calc offload``."""
    shape = resolve_model(args)
    if not shape.params:
        raise KvscopeError("the model's parameter count is unknown: give --params")
    device = device_arg(args)
    pcie = getattr(args, "pcie_gbps", None) or (device.pcie_gbps if device else None)
    tflops = getattr(args, "tflops", None) or (device.fp16_tflops if device else None)
    if pcie is None or tflops is None:
        raise KvscopeError("name a device (--device NAME) or give --pcie-gbps and --tflops")
    kv_dtype = args.kv_dtype or "fp16"
    # A long evicted prefix reloads what its full (or MLA) layers hold per token: a window
    # layer holds its last W tokens only, a state layer no token at all.
    per_token = shape.growing_bytes_per_token(kv_dtype)
    cost = reload_cost(shape.params, per_token, pcie, tflops)
    return plain_dict(
        {
            "model": plain_dict(asdict(shape)),
            "device": device.name if device else None,
            "params": shape.params,
            "kv_dtype": kv_dtype,
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


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _print_sizing(r: dict[str, Any]) -> None:
    m = r["model"]
    params = f", {_params(m['params'])} params" if m["params"] else ""
    forms = r["groups"]
    if len(forms) == 1 and forms[0]["kind"] == "full":
        layout = (
            f"{m['layers']} layers, {m['q_heads']} query heads, {m['kv_heads']} KV heads, "
            f"head_dim {m['head_dim']}"
        )
    else:
        layout = f"{m['layers']} layers: " + ", ".join(f"{g['layers']} {g['label']}" for g in forms)
    print(f"{m['name']}: {layout}{params}")
    budget = "kv_budget_bytes" in r
    where = f"{r['device'] or 'device'} ({r['memory_bytes'] / GIB:g} GiB), " if budget else ""
    lengths = (
        f"{r['seq_len']:,} tokens per sequence"
        if "seq_len" in r
        else f"{r['input_tokens']:,} in / {r['output_tokens']:,} out"
    )
    print(f"{where}KV {r['kv_dtype']}, {lengths}. Units: GiB = 2^30 bytes.\n")
    if budget:
        print(format_table(memory_rows(r), ["memory", "GiB", ""]) + "\n")
    per = r["kv_bytes_per_token"]
    kv = [
        ["KV bytes per token", count_text(per), human_bytes(per)],
        [
            "average tokens per request",
            count_text(r["avg_tokens_per_request"]),
            "--seq-len" if "seq_len" in r else "input + output/2",
        ],
        [
            "KV bytes per request",
            count_text(r["kv_bytes_per_request"]),
            human_bytes(r["kv_bytes_per_request"]),
        ],
    ]
    if budget:
        kv += [
            ["max average batch", count_text(r["max_avg_batch"]), ""],
            [
                "batch under max reservation",
                count_text(r["max_batch_max_reservation"]),
                f"{r['max_model_len']:,} tokens each",
            ],
            ["tokens in budget", count_text(r["tokens_in_budget"]), ""],
        ]
    if "kv_bytes_total" in r:
        total = r["kv_bytes_total"]
        kv.append(
            [
                f"KV for {r['batch']} x {r['seq_len']:,} tokens",
                count_text(total),
                human_bytes(total),
            ]
        )
    print(format_table(kv, ["KV cache", "", ""]) + "\n")
    if len(r["groups"]) > 1 or r["groups"][0]["kind"] != "full":
        rows = [
            [
                g["label"],
                str(g["layers"]),
                count_text(g["kv_bytes_per_token"]),
                human_bytes(g["kv_bytes_per_request"]),
                f"{g['share_of_request']:.1%}" if g["share_of_request"] is not None else "",
            ]
            for g in r["groups"]
        ]
        print(format_table(rows, ["layers by form", "layers", "bytes/token", "per request",
                                  "share"]) + "\n")  # fmt: skip
    figures = ["kv_bytes_per_token", "kv_bytes_per_request"]
    columns = ["bytes/token", "bytes/request"]
    if budget:
        figures = [
            "kv_bytes_per_token",
            "max_avg_batch",
            "max_batch_max_reservation",
            "tokens_in_budget",
        ]
        columns = ["bytes/token", "max avg batch", "max-len batch", "tokens in budget"]

    def row(label: str, c: dict[str, Any], *extra: str) -> list[str]:
        return [label, *extra, *(count_text(c[f]) for f in figures)]

    heads = [row(k, c, str(c["kv_heads"])) for k, c in r["by_kv_heads"].items()]
    if heads:
        print(format_table(heads, ["attention", "KV heads", *columns]) + "\n")
    dtypes = [row(k, c) for k, c in r["by_kv_dtype"].items()]
    print(format_table(dtypes, ["KV dtype", *columns]))
    if not budget:
        print("\nadd --device NAME (or --memory-gib N) for the KV budget and the batch that fits")


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
        [f"KV bytes per token ({r['kv_dtype']})", count_text(r["kv_bytes_per_token"])],
        ["PCIe GB/s", count_text(r["pcie_gbps"])],
        ["compute TFLOP/s", count_text(r["tflops"])],
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
