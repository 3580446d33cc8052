"""What a sweep prints: the points' table, the answer sentence (the capacity that
reaches a share of the ceiling hit rate), why tokens missed, the replicas'
comparison, the refusals' warning, the hit-rate figure and each point's progress line."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvscope.app.output_format import format_table, human_bytes
from kvscope.app.progress import Progress
from kvscope.engine.eviction import POLICIES
from kvscope.engine.presets import device_preset, model_preset
from kvscope.engine.replay.config import (
    ReplayConfig,
    ReplayResult,
)
from kvscope.engine.replay.traces import ReplayTrace
from kvscope.engine.sizing import GIB, MemoryBudget, weight_bytes

if TYPE_CHECKING:
    pass


CEILING_SHARE = 0.9

# The roofline's batch limits and their defaults; a sequential replay runs one request
# at a time, each in one step, so giving either without --timing roofline is refused.
ROOFLINE_BATCH = {
    f.name: f.default
    for f in dataclasses.fields(ReplayConfig)
    if f.name in ("max_batched_tokens", "max_num_seqs")
}


def _tokens_text(n: int | None) -> str:
    if n is None:
        return "unlimited"
    return f"{n:.0e}".replace("e+0", "e") if n >= 10_000 and float(f"{n:.0e}") == n else f"{n:,}"


def answer(
    rows: list[dict[str, Any]],
    ceiling: float,
    config: ReplayConfig,
    trace: ReplayTrace,
    policy: str,
) -> dict[str, Any]:
    """The smallest swept capacity reaching 90% of the ceiling, in tokens and GiB, and what
    that leaves for the batch on the device (``kvscope calc`` terms)."""
    bpt = config.bytes_per_token
    target = CEILING_SHARE * ceiling
    ok = [r for r in rows if r["policy"] == policy and r["capacity_tokens"] is not None
          and r["hit_rate"] >= target]  # fmt: skip
    out: dict[str, Any] = {"policy": policy, "ceiling": ceiling, "target": target}
    if not ok or ceiling <= 0:
        out["capacity_tokens"] = None
        return out
    cap = min(r["capacity_tokens"] for r in ok)
    cache_bytes = cap * bpt
    device = device_preset(config.device)
    model = model_preset(config.model)
    budget = MemoryBudget(device.memory_gib * GIB, weight_bytes(model.num_params, "bf16"))
    left = budget.kv_bytes - cache_bytes
    # over the requests the context admits: a refused 1e8-token line is no request's size
    sizes = [e.input_len + e.output_len for e in trace.entries if config.admits(e)]
    mean_tokens = sum(sizes) / max(1, len(sizes))
    out.update(
        capacity_tokens=cap,
        capacity_bytes=cache_bytes,
        device=device.name,
        device_kv_bytes=budget.kv_bytes,
        left_for_batch_bytes=left,
        mean_request_tokens=mean_tokens,
        batch_at_mean=max(0, math.floor(left / (bpt * mean_tokens))) if left > 0 else 0,
        devices_for_cache=math.ceil(cache_bytes / budget.kv_bytes) if budget.kv_bytes > 0 else None,
    )
    return out


def answer_text(a: dict[str, Any], config: ReplayConfig) -> str:
    ceiling = a["ceiling"]
    if a.get("capacity_tokens") is None:
        return (
            f"No capacity swept reaches {CEILING_SHARE:.0%} of the {ceiling:.1%} ceiling "
            f"({a['policy']}); try larger capacities."
        )
    cap, nbytes = a["capacity_tokens"], a["capacity_bytes"]
    head = (
        f"With {a['policy']}, {cap:,} tokens of prefix cache ({human_bytes(nbytes)} of "
        f"{config.model} KV in {config.kv_dtype}) reach {CEILING_SHARE:.0%} of the "
        f"{ceiling:.1%} ceiling (the smallest capacity swept that does)."
    )
    left = a["left_for_batch_bytes"]
    if left > 0:
        tail = (
            f" On one {a['device']} ({human_bytes(a['device_kv_bytes'])} for KV after bf16 "
            f"weights and overhead) that leaves {human_bytes(left)}: a batch of "
            f"{a['batch_at_mean']} requests of the trace's mean {a['mean_request_tokens']:,.0f} tokens."
        )
    else:
        tail = (
            f" That is more than one {a['device']} holds for KV ({human_bytes(a['device_kv_bytes'])}): "
            f"the cache alone needs {a['devices_for_cache']} devices' KV memory."
        )
    return head + tail


def figure(rows: list[dict[str, Any]], ceilings: dict[int, float]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for policy, ps in sorted({(r["policy"], r["page_size"]) for r in rows if r["capacity_tokens"]}):
        pts = sorted(
            (r["capacity_tokens"], r["hit_rate"]) for r in rows
            if r["policy"] == policy and r["page_size"] == ps and r["capacity_tokens"]
        )  # fmt: skip
        name = policy if len(ceilings) == 1 else f"{policy} (page {ps})"
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts], y=[100 * p[1] for p in pts], mode="lines+markers", name=name
            )
        )
    for ps, ceiling in ceilings.items():
        label = "unlimited" if len(ceilings) == 1 else f"unlimited (page {ps})"
        fig.add_hline(y=100 * ceiling, line_dash="dot", annotation_text=f"{label}: {ceiling:.1%}")
    fig.update_layout(
        template="plotly_white",
        xaxis={"type": "log", "title": "cache capacity (tokens)"},
        yaxis={"title": "prompt tokens hit (%)", "rangemode": "tozero"},
        title="Prefix-cache hit rate against capacity",
    )
    return fig


def point_progress(total: int, quiet: bool) -> Callable[..., None]:
    """The sweep's callback: a line per finished point, its hit rate the detail."""
    progress = None if quiet else Progress(total, "points")

    def finished(done: int, total: int, config: ReplayConfig, result: ReplayResult) -> None:
        if progress is None:
            return
        progress.advance(
            detail=f"{config.eviction_policy} {_tokens_text(config.capacity_tokens)} "
            f"page {config.page_size}: {result.hit_rate:.1%} hit ({result.wall_s:.1f} s)"
            + (f", {result.rejected} refused" if result.rejected else "")
        )

    return finished


def table(rows: list[dict[str, Any]], roofline: bool) -> str:
    policies = sorted({r["policy"] for r in rows if r["capacity_tokens"]}, key=list(POLICIES).index)
    page_sizes = sorted({r["page_size"] for r in rows})
    header = [
        "capacity",
        "KV size",
        *(p if len(page_sizes) == 1 else f"{p}/{ps}" for ps in page_sizes for p in policies),
    ]
    if roofline:
        header += ["TTFT p50", "TTFT p99", "preempt"]
    refused = any(r["rejected"] for r in rows)
    if refused:  # the same for every policy at one capacity and page size
        header += ["refused" if len(page_sizes) == 1 else f"refused/{ps}" for ps in page_sizes]
    caps = sorted({r["capacity_tokens"] for r in rows if r["capacity_tokens"]}) + [None]
    by = {(r["capacity_tokens"], r["policy"], r["page_size"]): r for r in rows}
    out = []
    for cap in caps:
        some = next(r for r in rows if r["capacity_tokens"] == cap)
        line = [_tokens_text(cap), "" if cap is None else human_bytes(some["capacity_bytes"])]
        for ps in page_sizes:
            for p in policies:
                r = by.get((cap, p, ps)) or (
                    by.get((None, rows[-1]["policy"], ps)) if cap is None else None
                )
                line.append("" if r is None else f"{r['hit_rate']:.1%}")
        if roofline:
            r = by.get((cap, policies[0], page_sizes[0])) or some
            line += [_secs(r["ttft_p50_s"]), _secs(r["ttft_p99_s"]), str(r["preemptions"])]
        if refused:
            for ps in page_sizes:
                r = by.get((cap, policies[0], ps)) or by.get((None, rows[-1]["policy"], ps))
                line.append(f"{r['rejected']:,} of {r['requests']:,}")
        out.append(line)
    return format_table(out, header)


def refusal_warning(
    results: list[tuple[ReplayResult, Any]], points: list[ReplayConfig], total: int, source: str
) -> str | None:
    """One line for all the points: how many requests were refused, why, and the first
    offending line; None if none was. Context refusals are the same at every point;
    capacity ones (roofline) depend on it, so the worst point is named."""
    parts, most = [], 0
    context = next((r.refused["context"] for r, _ in results if "context" in r.refused), None)
    if context is not None:
        most = context["count"]
        parts.append(
            f"{context['count']:,} longer than the context of {points[0].max_model_len:,} tokens "
            f"({source}) at every point, first {context['first']} "
            f"({context['tokens']:,} tokens)"
        )
    worst = max(
        (
            (r.refused["capacity"], c)
            for (r, _), c in zip(results, points, strict=True)
            if "capacity" in r.refused
        ),
        key=lambda pair: pair[0]["count"],
        default=None,
    )
    if worst is not None:
        cap, config = worst
        most += cap["count"]
        parts.append(
            f"{cap['count']:,} larger than the whole KV pool at {_tokens_text(config.capacity_tokens)} "
            f"tokens (page {config.page_size}), first {cap['first']} ({cap['tokens']:,} tokens); "
            "per capacity in the 'refused' column"
        )
    if not parts:
        return None
    return (
        f"kvscope replay: warning: {'up to ' if worst else ''}{most:,} of {total:,} requests "
        "refused, never scheduled (the figures are over the admitted ones): " + "; ".join(parts)
    )


def _secs(s: float | None) -> str:
    return "" if s is None else f"{s:.3g} s"


def miss_table(rows: list[dict[str, Any]]) -> str:
    """Why the prompt tokens each point missed missed (engine/miss_reasons.py), as shares."""
    from kvscope.db.miss_reasons import REASONS

    out = []
    for r in sorted(rows, key=lambda r: (r["capacity_tokens"] is None, r["capacity_tokens"] or 0)):
        m = r.get("miss_reasons")
        if not m:
            continue
        missed = m["cold"] + m["capacity"] + m["granularity"] + m["last_token"]
        shares = [f"{m[name] / missed:.1%}" if missed else "" for name, _ in REASONS]
        age = m["capacity_age_steps"] / m["capacity_pages"] if m["capacity_pages"] else None
        out.append(
            [
                _tokens_text(r["capacity_tokens"]),
                r["policy"] if r["capacity_tokens"] is not None else "",
                f"{r['page_size']}",
                *shares,
                "" if age is None else f"{age:,.0f}",
            ]
        )
    header = ["capacity", "policy", "page", *(label for _, label in REASONS), "evicted ago"]
    return (
        "Why missed tokens missed (share of missed tokens; 'evicted ago': mean engine "
        "steps between a capacity page's eviction and its next use)\n" + format_table(out, header)
    )


def replica_table(replicated: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """Hit rate per routing beside one engine of the whole capacity, and duplication."""
    one = {(r["capacity_tokens"], r["policy"], r["page_size"]): r["hit_rate"] for r in rows}
    out = [
        [
            _tokens_text(r["capacity_tokens"]),
            r["policy"],
            r["routing"],
            f"{r['hit_rate']:.1%}",
            f"{one[(r['capacity_tokens'], r['policy'], r['page_size'])]:.1%}",
            f"{r['duplicated_blocks']:,.0f}",
            f"{r['duplicated_share']:.1%}",
        ]
        for r in replicated
    ]
    n = replicated[0]["replicas"]
    header = [
        "capacity",
        "policy",
        "routing",
        f"{n} replicas",
        "1 engine",
        "dup blocks",
        "dup share",
    ]
    return (
        f"{n} replicas, each 1/{n} of the capacity ('dup blocks': prefixes cached on more "
        "than one replica, mean over the replay; 'dup share': cached pages that are such copies)\n"
        + format_table(out, header)
    )
