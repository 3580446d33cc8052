"""The figure panels: fragmentation, prefix cache, churn, kernels, GPU (and the
measured memory budget), throughput, InfLLM retrieval.

Each panel is a pure function of a ``View`` and a width, so tests check the
figures without a terminal, and a widget that repaints when its view changes.
Rows are "label  value  sparkline": the sparkline takes whatever width is left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from kvscope.app.tui import fmt
from kvscope.app.tui.data import View
from kvscope.db import formulas
from kvscope.db.events import CHURN_KINDS
from kvscope.db.kernels import device_peaks
from kvscope.db.memory_budget import (
    DEFAULT_BUDGET,
    GROWN_BUDGET,
    MeasuredBudget,
    fixed_kv_budget,
)

LABEL_STYLE = "#8c9bb0"
VALUE_STYLE = "bold #e5e9f0"
SPARK_STYLE = "#5e9fd0"
NOTE_STYLE = "italic #6b7385"
LABEL_WIDTH = 12
VALUE_WIDTH = 9


def _line(
    text: Text,
    label: str,
    value: str,
    width: int,
    history: Sequence[float | None] = (),
    top: float | None = None,
    note: str = "",
) -> None:
    """Append one "label  value  [sparkline | note]" row, cut to ``width``."""
    if text:
        text.append("\n")
    text.append(label.ljust(LABEL_WIDTH), LABEL_STYLE)
    text.append(value.rjust(VALUE_WIDTH), VALUE_STYLE)
    room = width - LABEL_WIDTH - VALUE_WIDTH - 2
    if history and room > 0:
        text.append("  " + fmt.spark(history, room, top), SPARK_STYLE)
    elif note:
        text.append("  " + note, NOTE_STYLE)


def fragmentation_text(view: View, width: int) -> Text:
    """Page-level vs token-level usage: the gap is internal fragmentation."""
    row, text = view.row, Text()
    assert row is not None
    slots = formulas.token_slots(row.pages_used, row.page_size)
    wasted = formulas.internal_fragmentation(slots, row.tokens_held)
    history = view.history
    _line(
        text,
        "page usage",
        fmt.pct(formulas.page_usage(row.pages_used, row.pages_total)),
        width,
        [p.page_usage for p in history],
        1.0,
    )
    _line(
        text,
        "token usage",
        fmt.pct(formulas.token_usage(row.tokens_held, slots)),
        width,
        [p.token_usage for p in history],
        1.0,
    )
    _line(
        text,
        "empty slots",
        fmt.count(wasted),
        width,
        [p.fragmentation_slots for p in history],
    )
    _line(
        text,
        "wasted",
        fmt.pct(formulas.ratio(wasted, slots)),
        width,
        note=f"of {fmt.count(slots)} slots",
    )
    return text


def prefix_text(view: View, width: int) -> Text:
    """Hit rate over the window and overall, what the cache holds, the tree's size."""
    row, text = view.row, Text()
    assert row is not None
    total, window = view.total, view.window
    _line(
        text,
        f"hit {window.span_s:.0f}s" if window.span_s >= 1 else "hit window",
        fmt.pct(formulas.hit_rate(window.prefix_hit_tokens, window.prefix_queried_tokens)),
        width,
        [p.hit_rate for p in view.history],
        1.0,
    )
    _line(
        text,
        "hit overall",
        fmt.pct(formulas.hit_rate(total.prefix_hit_tokens, total.prefix_queried_tokens)),
        width,
        note=f"{fmt.count(total.prefix_hit_tokens)} / {fmt.count(total.prefix_queried_tokens)} tok",
    )
    _line(
        text,
        "cached",
        f"{fmt.count(row.pages_cached)} pg",
        width,
        [p.pages_cached for p in view.history],
    )
    _line(
        text,
        "cached tok",
        fmt.count(row.pages_cached * row.page_size),
        width,
        note="unreferenced",
    )
    _line(text, "tree", f"{fmt.count(view.tree_pages)} pg", width, note="in the radix tree")
    return text


_CHURN_LABELS = dict(
    zip(CHURN_KINDS, ("evicted", "offloaded", "reloaded", "preempted"), strict=True)
)


def churn_text(view: View, width: int) -> Text:
    """Evictions, offloads, reloads and preemptions: totals, recent rate, history."""
    row, text = view.row, Text()
    assert row is not None
    window = view.window
    rate_room = 9
    for kind in CHURN_KINDS:
        per_s = formulas.per_second(window.churn[kind], window.span_s)
        label = _CHURN_LABELS[kind]
        _line(text, label, fmt.count(view.total.churn[kind]), width - rate_room)
        text.append(fmt.rate(per_s).rjust(rate_room - 1), LABEL_STYLE)
        room = width - LABEL_WIDTH - VALUE_WIDTH - rate_room - 3
        if room > 0:
            text.append("  " + fmt.spark(view.churn_history[kind], room), SPARK_STYLE)
    _line(
        text,
        "host tier",
        f"{fmt.count(row.host_pages_used)} pg",
        width,
        [p.host_pages_used for p in view.history],
    )
    return text


def kernels_table(view: View) -> RenderableType:
    """Per kernel: calls, mean time, achieved TFLOP/s and GB/s, share of the device's peak."""
    if not view.kernels:
        return Text("no kernel timings recorded", style=NOTE_STYLE)
    table = Table(box=None, expand=True, padding=(0, 1), header_style=LABEL_STYLE)
    table.add_column("kernel", style=VALUE_STYLE, no_wrap=True, overflow="ellipsis", ratio=1)
    for name in ("calls", "mean", "TFLOP/s", "GB/s", "%peak"):
        table.add_column(name, justify="right", no_wrap=True)
    for k in view.kernels:
        peak = max(
            (f for f in (k.peak_tflops_frac, k.peak_gbps_frac) if f is not None), default=None
        )
        table.add_row(
            k.name,
            fmt.count(k.calls),
            fmt.seconds(k.mean_s),
            fmt.number(k.tflops, 3),
            fmt.number(k.gbps, 1),
            fmt.pct(peak),
        )
    peaks = device_peaks(view.run)
    if peaks.tflops or peaks.gbps:
        caption = (
            f"%peak: higher share of {fmt.peak(peaks.tflops)} TFLOP/s "
            f"or {fmt.peak(peaks.gbps)} GB/s ({peaks.source})"
        )
    else:
        caption = "%peak: device peak unknown"
    table.caption = caption
    table.caption_style = NOTE_STYLE
    table.caption_justify = "left"
    return table


# The budget's source in a few words, for the TUI's one line (else: --kv-budget).
KV_SOURCE_SHORT = {GROWN_BUDGET: "grown to fit", DEFAULT_BUDGET: "run's default"}


def budget_text(budget: MeasuredBudget, config: dict | None = None) -> Text:
    """The measured memory budget's four terms (weights, activations, framework
    overhead, KV cache) and calc's KV prediction, on one line; a KV cache fixed by
    ``--kv-budget`` says so instead of comparing with calc."""
    text = Text()
    text.append("mem ", LABEL_STYLE)
    for label, n in (
        ("W", budget.weights_bytes),
        ("A", budget.activation_bytes),
        ("O", budget.overhead_bytes),
        ("KV", budget.kv_bytes),
    ):
        text.append(f"{label} ", LABEL_STYLE)
        text.append(f"{fmt.size(n)} ", VALUE_STYLE)
    if fixed_kv_budget(config or {}) is not None:
        source = (config or {}).get("kv_budget_source")
        text.append(f"KV {KV_SOURCE_SHORT.get(source, 'fixed by --kv-budget')}", NOTE_STYLE)
    else:
        text.append(f"calc {fmt.size(budget.predicted_kv_bytes)}", NOTE_STYLE)
    return text


def gpu_text(view: View, width: int) -> Text:
    """Utilization, memory and power of the device the run used, or N/A without one;
    then the measured memory budget when the run recorded it."""
    text = _gpu_lines(view, width)
    if view.budget is not None:
        text.append("\n")
        text.append_text(budget_text(view.budget, view.run.config))
    return text


def _gpu_lines(view: View, width: int) -> Text:
    if not view.gpu:
        return Text("N/A (no GPU)", style=NOTE_STYLE)
    last, text = view.gpu[-1], Text()
    _line(
        text,
        "utilization",
        fmt.pct((last.utilization_pct or 0) / 100),
        width,
        [p.utilization_pct for p in view.gpu],
        100.0,
    )
    _line(
        text,
        "memory",
        fmt.gib(last.memory_used_bytes),
        width,
        [p.memory_used_bytes for p in view.gpu],
        last.memory_total_bytes,
    )
    _line(text, "total", fmt.gib(last.memory_total_bytes), width)
    _line(
        text,
        "power",
        f"{fmt.number(last.power_w, 0)} W",
        width,
        [p.power_w for p in view.gpu],
    )
    return text


# Shades of a block x step cell by the layers that attended the block (none to all).
SHADES = " ░▒▓█"
STRIP_ROWS = 8


def infllm_request(view: View, selected: int | None) -> int | None:
    """The request the strip shows: the selected one, else the one with most retrieval steps."""
    rows = view.retrievals or []
    steps: dict[int, int] = {}
    for r in rows:
        steps[r.request_id] = steps.get(r.request_id, 0) + 1
    if selected in steps:
        return selected
    return max(steps, key=lambda rid: (steps[rid], -rid)) if steps else None


def infllm_text(view: View, width: int, selected: int | None = None) -> Text:
    """For one request: which distant blocks its recent steps attended (a block x step
    strip, rows of blocks, one column per step, darker = more layers) and its resident
    vs offloaded KV bytes at the newest step."""
    request = infllm_request(view, selected)
    if request is None:
        return Text("no retrievals in the recent steps", style=NOTE_STYLE)
    mine = [r for r in view.retrievals or [] if r.request_id == request]
    last = mine[-1]
    text = Text()
    text.append(f"request {request}  ", VALUE_STYLE)
    text.append("resident ", LABEL_STYLE)
    # Gaps end the span before them: an SVG screenshot drops a span's leading spaces.
    text.append(f"{fmt.size(last.resident_bytes)}  ", VALUE_STYLE)
    text.append("offloaded ", LABEL_STYLE)
    text.append(f"{fmt.size(last.offloaded_bytes)}  ", VALUE_STYLE)
    text.append(f"{last.blocks_total} distant blocks", NOTE_STYLE)
    label_width = 8
    room = max(1, width - label_width - 1)
    columns = mine[-room:]
    cell = min(3, room // len(columns))  # wider cells while the strip is short
    blocks = max(r.blocks_total for r in columns)
    per_row = -(-blocks // STRIP_ROWS)
    layers = max((n for r in columns for n in r.chosen.values()), default=1)
    for lo in range(0, blocks, per_row):
        hi = min(blocks, lo + per_row)
        text.append("\n")
        text.append(f"{lo}-{hi - 1}".rjust(label_width - 1) + " ", LABEL_STYLE)
        for r in columns:
            attended = max((r.chosen.get(b, 0) for b in range(lo, hi)), default=0)
            shade = SHADES[-(-attended * (len(SHADES) - 1) // layers)] if attended else "·"
            text.append(shade * cell, SPARK_STYLE)
    text.append(f"\nsteps {columns[0].step}-{columns[-1].step} →", NOTE_STYLE)
    return text


def throughput_text(view: View, width: int) -> Text:
    """Tokens per second now and overall, and the scheduler's queue."""
    row, text = view.row, Text()
    assert row is not None
    recent, total = view.recent, view.total
    _line(
        text,
        "decode",
        fmt.rate(recent.decode_tokens_per_s if recent else None, " t/s"),
        width,
        [p.decode_tokens_per_s for p in view.history],
    )
    _line(
        text,
        "prefill",
        fmt.rate(recent.prefill_tokens_per_s if recent else None, " t/s"),
        width,
        [p.prefill_tokens_per_s for p in view.history],
    )
    _line(
        text,
        "overall",
        fmt.rate(formulas.per_second(total.decode_tokens, total.span_s), " t/s"),
        width,
        note="decode, since start",
    )
    _line(text, "running", fmt.count(row.running), width, [p.running for p in view.history])
    _line(text, "waiting", fmt.count(row.waiting), width, [p.waiting for p in view.history])
    return text


class Panel(Widget):
    """A bordered panel whose content is ``content(view, width)``."""

    view: reactive[View | None] = reactive(None, always_update=True)
    """The figures at the current position; None until the run has a step."""

    def __init__(self, title: str, content: Callable[[View, int], RenderableType], **kw) -> None:
        super().__init__(**kw)
        self.border_title = title
        self._content = content

    def render(self) -> RenderableType:
        if self.view is None or self.view.row is None:
            return Text("waiting for data", style=NOTE_STYLE)
        return self._content(self.view, self.size.width)
