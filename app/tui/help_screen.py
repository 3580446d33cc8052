"""The help screen (``?``): every key, and what each panel shows."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from kvscope.app.tui.keys import BINDINGS, OTHER_KEYS
from kvscope.app.tui.palette import SHARED_SHADES, STATE_COLOURS, STATE_NAMES

PANELS = (
    ("Page occupancy", "one cell per KV page (several per cell when they do not fit)"),
    ("Fragmentation", "page-level vs token-level usage; empty slots are internal fragmentation"),
    ("Prefix cache", "hit rate (hit / queried tokens) recently and overall; cached pages; tree"),
    ("Eviction · offload · preemption", "totals, recent rate and history; host-tier pages"),
    ("Kernels", "per kernel: calls, mean time, TFLOP/s, GB/s, share of the device's peak"),
    ("GPU", "utilization, memory and power from NVML, or N/A without a GPU"),
    ("Requests", "state, tokens, pages held, TTFT and TPOT at the shown step"),
    ("Throughput", "decode and prefill tokens/s now and overall; running and waiting"),
)


def help_table() -> Table:
    """Keys, then panels, then the page-map legend, as one two-column table."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold #edc948", no_wrap=True)
    table.add_column()
    table.add_row(Text("Keys", style="bold underline #e5e9f0"), "")
    for binding in BINDINGS:
        table.add_row(binding.key_display or binding.key, binding.description)
    for keys, description in OTHER_KEYS:
        table.add_row(keys, description)
    table.add_row("", "")
    table.add_row(Text("Panels", style="bold underline #e5e9f0"), "")
    for name, description in PANELS:
        table.add_row(Text(name, style="bold #8cd17d"), description)
    table.add_row("", "")
    legend = Text()
    for code, name in STATE_NAMES.items():
        legend.append("■ ", style=STATE_COLOURS[code]).append(f"{name}  ")
    legend.append("■", style="#4e79a7").append("■", style="#f28e2b").append(
        " private: one colour per request  "
    )
    for shade in SHARED_SHADES:
        legend.append("■", style=shade)
    legend.append(" shared by 2 / 3-4 / 5-8 / 9+ requests (larger cells show the count)")
    table.add_row(Text("Page map", style="bold underline #e5e9f0"), legend)
    return table


class HelpScreen(ModalScreen[None]):
    """Keys and panels; any of Esc, q or ? closes it."""

    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss", "Close", key_display="Esc"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_table())
            yield Static("Esc, q or ? to close", id="help-close")

    def on_mount(self) -> None:
        scroll = self.query_one("#help", VerticalScroll)
        scroll.border_title = "kvscope TUI help"
        # On a small terminal (80x24) the help is taller than the screen: the frame says
        # there is more and how to reach it: the arrows, PgUp/PgDn and Home/End scroll it
        # (the app's replay keys yield to a dialog, KvscopeApp.check_action).
        scroll.border_subtitle = "↑↓ PgUp PgDn Home End scroll · Esc, q or ? close"
        scroll.focus()
