"""``kvscope calc cliff``: the context length past which a device's decode turns bandwidth-bound.

By context length, the average batch the KV budget holds against the batch
that keeps the device compute-bound (``engine.sizing.compute_bound_batch``),
with and without quantized KV and with an InfLLM resident budget; a table,
``--json`` and a plotly chart.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from typing import Any

from kvscope.app.output_format import GIB, count_text, format_table, plain, plain_dict
from kvscope.app.sizing_args import (
    budget_figures,
    device_arg,
    memory_budget,
    memory_rows,
    resolve_model,
)
from kvscope.engine.errors import KvscopeError
from kvscope.engine.sizing import (
    FULL,
    WEIGHT_BYTES_PER_PARAM,
    ContextShape,
    Residency,
    compute_bound_batch,
    shape_batch_at_context,
    shape_cliff_context,
)

CLIFF_DESCRIPTION = (
    "By context length: the average batch the KV budget holds against the batch that keeps the "
    "device compute-bound (FLOP/s over bytes/s: a decode step reads every weight once). "
    "A context of L tokens splits into prompt and output as --input-tokens:--output-tokens "
    "(default 1024:1024). The cliff is the longest context at which the budget still holds the "
    "compute-bound batch. Units: GiB = 2^30 bytes, TFLOP/s = 1e12, GB/s = 1e9."
)

CURVE_POINTS = 96  # contexts on the plot's log axis


def _context_grid(max_context: int) -> list[int]:
    """Powers of two from 1,024 tokens up to ``max_context`` (and it)."""
    grid = [1 << p for p in range(10, max_context.bit_length()) if 1 << p < max_context]
    return [*grid, max_context]


def cliff_report(args: argparse.Namespace) -> dict[str, Any]:
    """``kvscope calc cliff``: KV batch by context length against the compute-bound batch."""
    shape = resolve_model(args)
    budget = memory_budget(args, shape, needed_for="the cliff")
    device = device_arg(args)
    tflops = getattr(args, "tflops", None) or (device.fp16_tflops if device else None)
    hbm = getattr(args, "hbm_gbps", None) or (device.hbm_gbps if device else None)
    if tflops is None or hbm is None:
        raise KvscopeError("name a device (--device NAME) or give --tflops and --hbm-gbps")
    needed = compute_bound_batch(tflops, hbm, WEIGHT_BYTES_PER_PARAM[args.weight_dtype])
    split = ContextShape.of(args.input_tokens, args.output_tokens)
    context = args.input_tokens + args.output_tokens
    residency = getattr(args, "resident_tokens", None)
    grid = _context_grid(getattr(args, "max_context", None) or 131072)
    curve = _log_grid(min(grid[0], 256), grid[-1], CURVE_POINTS)  # the plot's contexts
    dtypes = list(dict.fromkeys(("fp16", args.kv_dtype or "fp8_e4m3")))
    variants = [(dtype, FULL) for dtype in dtypes]
    if residency is not None:
        variants += [(dtype, residency) for dtype in dtypes]

    state_dtype = getattr(args, "state_dtype", None)

    def scenario(dtype: str, resident: Residency) -> dict[str, Any]:
        per_token = shape.bytes_per_token(dtype)

        def batch(length: int) -> int:
            return shape_batch_at_context(
                shape, budget.kv_bytes, length, split, dtype, state_dtype, resident
            )

        return plain_dict(
            {
                "kv_dtype": dtype,
                "resident_tokens": resident.tokens,
                "resident_fraction": resident.fraction,
                "kv_bytes_per_token": plain(per_token),
                "batch_at_input_output": batch(context),
                "cliff_context_len": shape_cliff_context(
                    shape, budget.kv_bytes, needed, split, dtype, state_dtype, resident
                ),
                "batches": [batch(length) for length in grid],
                "curve": [batch(length) for length in curve],
            }
        )

    return plain_dict(
        {
            "units": "bytes; GiB = 2^30 bytes; TFLOP/s = 1e12 FLOP/s; GB/s = 1e9 bytes/s",
            "model": plain_dict(asdict(shape)),
            **budget_figures(args, budget),
            "tflops": tflops,
            "hbm_gbps": hbm,
            "compute_bound_batch": needed,
            "input_tokens": args.input_tokens,
            "output_tokens": args.output_tokens,
            "contexts": grid,
            "curve_contexts": curve,
            "scenarios": {_scenario_name(d, r): scenario(d, r) for d, r in variants},
        }
    )


def _scenario_name(dtype: str, resident: Residency) -> str:
    if resident == FULL:
        return f"{dtype} KV"
    share = f"{resident.fraction:.0%}" if resident.tokens is None else f"{resident.tokens:,.0f}"
    return f"{dtype} KV, InfLLM {share} resident"


def _print_cliff(r: dict[str, Any]) -> None:
    m = r["model"]
    print(
        f"{m['name']} on {r['device'] or 'a device'} ({r['memory_bytes'] / GIB:g} GiB). Units: GiB = 2^30 bytes.\n"
    )
    print(format_table(memory_rows(r), ["memory", "GiB", ""]) + "\n")
    needed = r["compute_bound_batch"]
    print(
        f"compute-bound batch: {r['tflops']:,g} TFLOP/s / {r['hbm_gbps']:,g} GB/s = {needed:,.0f}"
        f" (a decode step reads every {r['weight_dtype'] or 'fp16'} weight once)"
    )
    context = f"{r['input_tokens']:,}+{r['output_tokens']:,}"
    scenarios = r["scenarios"]
    for name, s in scenarios.items():
        print(f"{name}: average batch at {context} tokens {s['batch_at_input_output']:,}")
    print()
    rows = [
        [f"{length:,}", *(count_text(s["batches"][i]) for s in scenarios.values())]
        for i, length in enumerate(r["contexts"])
    ]
    rows.append(["cliff at", *(_cliff(s["cliff_context_len"]) for s in scenarios.values())])
    print(format_table(rows, ["context", *scenarios]))
    print(
        f"\nPast the cliff the KV budget holds fewer than {needed:,.0f} requests: "
        "decode stays bandwidth-bound."
    )


def _cliff(length: int | None) -> str:
    return "never" if length is None else f"{length:,}"


def cliff_figure(r: dict[str, Any]) -> Any:
    """Average batch against context length per scenario, the compute-bound line, and the cliffs."""
    import plotly.graph_objects as go

    fig = go.Figure()
    needed = r["compute_bound_batch"]
    for name, s in r["scenarios"].items():
        fig.add_trace(
            go.Scatter(
                x=r["curve_contexts"],
                y=s["curve"],
                mode="lines",
                name=name,
            )
        )
        if s["cliff_context_len"]:
            fig.add_vline(
                x=s["cliff_context_len"],
                line_dash="dot",
                annotation_text=f"{name}: cliff at {s['cliff_context_len']:,}",
                annotation_textangle=-90,
            )
    fig.add_hline(
        y=needed,
        line_dash="dash",
        annotation_text=f"compute-bound batch {needed:,.0f}",
    )
    fig.update_layout(
        title=f"{r['model']['name']} on {r['device'] or 'a device'}: the throughput cliff",
        xaxis={"title": "context length (tokens)", "type": "log"},
        yaxis={"title": "average batch the KV budget holds", "type": "log"},
        template="plotly_white",
    )
    # On log axes plotly places annotations in log10 units (shapes in data units):
    # move the line labels to where their lines are.
    for note in fig.layout.annotations:
        if note.xref == "x" and note.x:
            note.x = math.log10(note.x)
        if note.yref == "y" and note.y:
            note.y = math.log10(note.y)
    return fig


def _log_grid(low: int, high: int, points: int) -> list[int]:
    ratio = (high / low) ** (1 / (points - 1))
    return sorted({round(low * ratio**i) for i in range(points)})


def run_cliff(args: argparse.Namespace) -> int:
    from kvscope.app.commands.simulate import write_plot  # simulate imports this module

    report = cliff_report(args)
    if getattr(args, "plot", None):
        write_plot(cliff_figure(report), args.plot)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_cliff(report)
    return 0
