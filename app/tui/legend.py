"""The page map's legend: the colours, how many pages a cell holds, the selection.

A pure function of what is shown (``legend_text``) and a widget that repaints
only when the text changed (its height may change, which costs a relayout).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from app.tui import fmt
from app.tui.data import View
from app.tui.palette import STATE_COLOURS, STATE_NAMES, owner_colour

NOTE = "#6b7385"


def legend_text(view: View | None, per_cell: int, selected: int | None) -> Text:
    """Colour keys; with a page map, its size, pages per cell and where it came
    from; with a selected request, the pages it holds."""
    text = Text()
    for code, name in STATE_NAMES.items():
        text.append("■ ", style=STATE_COLOURS[code]).append(f"{name}  ", style="#c0c8d4")
    text.append("■", style=owner_colour(0)).append("■", style=owner_colour(1))
    text.append("■ ", style=owner_colour(2)).append("requests", style="#c0c8d4")
    if view is not None and view.page_map is not None:
        snapshot = view.page_map
        text.append("\n")
        text.append(
            f"{fmt.count(len(snapshot.owners))} pages · {per_cell} per cell · "
            f"snapshot of step {snapshot.step} + page events",
            style=NOTE,
        )
        if view.row is not None:
            text.append(f" · host tier {fmt.count(view.row.host_pages_used)} pages", style=NOTE)
    if selected is not None:
        held = next((r.pages for r in view.requests if r.request_id == selected), 0) if view else 0
        text.append("\n")
        text.append("■ ", style=owner_colour(selected))
        text.append(
            f"request {selected} selected: {held} pages (Esc to clear)", style="bold #e5e9f0"
        )
    return text


class Legend(Static):
    """The legend under the page map."""

    def show(self, text: Text) -> None:
        if text != self.content:
            self.update(text)
