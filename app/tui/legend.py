"""The page map's legend: the colours, how many pages a cell holds, the selection.

A pure function of what is shown (``legend_text``) and a widget that repaints
only when the text changed (its height may change, which costs a relayout).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kvscope.app.tui import fmt
from kvscope.app.tui.data import View
from kvscope.app.tui.palette import SHARED_SHADES, STATE_COLOURS, STATE_NAMES, owner_colour

NOTE = "#6b7385"


def legend_text(view: View | None, per_cell: int, selected: int | None) -> Text:
    """Colour keys; with a page map, its size, pages per cell, the mix of states
    and where it came from; with a selected request, the pages it holds."""
    text = Text()
    for code, name in STATE_NAMES.items():
        text.append("■ ", style=STATE_COLOURS[code]).append(f"{name}  ", style="#c0c8d4")
    text.append("■", style=owner_colour(0)).append("■", style=owner_colour(1))
    text.append("■ ", style=owner_colour(2)).append("private  ", style="#c0c8d4")
    for shade in SHARED_SHADES:
        text.append("■", style=shade)
    text.append(" shared ×2-9+", style="#c0c8d4")
    states = view.page_states if view is not None else None
    if view is not None and view.page_map is not None or states is not None:
        text.append("\n")
        num_pages = states.num_pages if states is not None else len(view.page_map.owners)
        if states is not None:
            c = states.counts()
            held = states.holders[states.holders >= 2]
            most = f", up to ×{int(held.max())}" if held.size else ""
            text.append(
                f"{fmt.count(num_pages)} pages · {per_cell} per cell"
                f"{' (its most common state)' if per_cell > 1 else ''} · "
                f"private {fmt.count(c.private)} · shared {fmt.count(c.shared)}{most} · "
                f"cached {fmt.count(c.cached)} · free {fmt.count(c.unused)} · "
                f"tree {fmt.count(c.tree)}",
                style=NOTE,
            )
        else:
            text.append(
                f"{fmt.count(num_pages)} pages · {per_cell} per cell · "
                f"snapshot of step {view.page_map.step} + page events (no holder counts)",
                style=NOTE,
            )
        if view.row is not None:
            text.append(f" · host tier {fmt.count(view.row.host_pages_used)} pages", style=NOTE)
    if selected is not None:
        r = next((r for r in view.requests if r.request_id == selected), None) if view else None
        text.append("\n")
        text.append("■ ", style=owner_colour(selected))
        detail = (
            f"{r.pages} pages ({r.private_pages} private, {r.shared_pages} shared), "
            f"{r.would_free} freed if it finished now"
            if r is not None
            else "0 pages"
        )
        text.append(f"request {selected} selected: {detail} (Esc to clear)", style="bold #e5e9f0")
    return text


class Legend(Static):
    """The legend under the page map."""

    def show(self, text: Text) -> None:
        if text != self.content:
            self.update(text)
