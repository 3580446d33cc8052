"""The page occupancy grid: one cell per KV page, coloured by who holds it.

With few pages each page is a square ("■") in a grid labelled by page number;
with more pages than fit, each character holds two cells (a half block, top and
bottom), and with more still each cell aggregates several consecutive pages and
shows the state most of them are in (``db.page_states.cell_states``), so a pool of
100,000 pages draws as many cells as a small one; the legend says how many
pages a cell holds and the mix of states. A shared page (held by N >= 2
requests) is ivory, lighter with more holders, and in the larger layouts shows N.
Selecting a request lights every page it holds, shared ones included. Clicking a
page selects (one of) its request(s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.text import Text
from textual import events
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from kvscope.app.tui.palette import BACKGROUND, faded, owner_colour, state_colour
from kvscope.db.page_states import (
    STATE_SHARED,
    StepPages,
    cell_any,
    cell_holder,
    cell_holders,
    cell_states,
)
from kvscope.db.pages import dominant_owners

# Cell shapes from largest to smallest: (glyph, characters per cell, lines per
# cell row). The first that fits all pages is used; the glyph's empty top part
# and the trailing space keep neighbouring cells apart.
CELL_SHAPES = (("▆▆▆▆▆", 6, 2), ("▆▆▆", 4, 2), ("▆▆", 3, 1), ("■", 2, 1))


@dataclass(frozen=True, slots=True)
class Grid:
    """How pages are laid out on the widget's characters."""

    cols: int  # cells per row
    rows: int  # rows of cells
    per_cell: int  # consecutive pages shown by one cell
    glyph: str  # a cell's characters; "" for dense mode (two cells per character)
    cell_width: int  # characters per cell, gap included
    row_height: int  # lines per row of cells
    gutter: int  # characters of page-number labels left of each row

    @property
    def dense(self) -> bool:
        return not self.glyph


def plan_grid(num_pages: int, width: int, height: int) -> Grid:
    """The most readable layout of ``num_pages`` on ``width`` x ``height`` characters.

    Cells are as large as fits; rows hold a multiple of 8 cells (so rows start
    at round page numbers) and no more than needed to use the height, so a
    small pool is a block rather than a long strip.
    """
    width, height = max(width, 1), max(height, 1)
    gutter = len(str(max(num_pages - 1, 0))) + 1
    for glyph, cell_width, row_height in CELL_SHAPES:
        max_cols = (width - gutter) // cell_width
        max_rows = (height + row_height - 1) // row_height
        if max_cols < 1 or num_pages > max_cols * max_rows:
            continue
        cols = -(-num_pages // max_rows)
        cols = min(max_cols, -(-cols // 8) * 8) if max_cols >= 8 else max_cols
        return Grid(cols, -(-num_pages // cols), 1, glyph, cell_width, row_height, gutter)
    per_cell = max(1, -(-num_pages // (width * height * 2)))
    cells = -(-num_pages // per_cell)
    return Grid(width, -(-cells // width), per_cell, "", 1, 1, 0)


class PageGrid(Widget):
    """The occupancy grid of the page map at the shown position (``engine.events.PageMap``
    is the recorded snapshot it starts from)."""

    owners: reactive[np.ndarray | None] = reactive(None, always_update=True)
    """Owner per page (request id, PAGE_* code or PAGE_OFFLOADED); None before the first snapshot."""

    states: reactive[StepPages | None] = reactive(None, always_update=True)
    """Every page's state (db/page_states.py); drawn instead of ``owners`` when set."""

    selected: reactive[int | None] = reactive(None)
    """The request whose pages stand out (the others fade); None: all shown alike."""

    class RequestClicked(Message):
        """The user clicked a page held by ``request_id``."""

        def __init__(self, request_id: int) -> None:
            super().__init__()
            self.request_id = request_id

    def grid(self) -> Grid:
        return plan_grid(0 if self.owners is None else len(self.owners), *self.size)

    def render(self) -> Text:
        if self.owners is None:
            return Text("no page-map snapshot recorded yet", style="italic #8c9bb0")
        grid = self.grid()
        if self.states is not None and len(self.states.state) == len(self.owners):
            return self._render_states(grid)
        cells = dominant_owners(self.owners, grid.per_cell)
        text = Text(no_wrap=True, overflow="crop")
        if grid.dense:
            for row in range(0, grid.rows, 2):
                top = cells[row * grid.cols : (row + 1) * grid.cols]
                bottom = cells[(row + 1) * grid.cols : (row + 2) * grid.cols]
                for col, owner in enumerate(top):
                    below = self._colour(bottom[col]) if col < len(bottom) else None
                    text.append("▀", Style(color=self._colour(owner), bgcolor=below))
                text.append("\n")
        else:
            for row in range(grid.rows):
                if row:
                    text.append("\n" * grid.row_height)
                label = str(row * grid.cols).rjust(grid.gutter - 1)
                text.append(label + " ", style="#6b7385")
                gap = " " * (grid.cell_width - len(grid.glyph))
                for owner in cells[row * grid.cols : (row + 1) * grid.cols]:
                    text.append(grid.glyph + gap, style=self._colour(owner))
        text.rstrip()
        return text

    def _render_states(self, grid: Grid) -> Text:
        pages, per = self.states, grid.per_cell
        state = cell_states(pages.state, per)
        holder = cell_holder(pages.holder, per)
        holders = cell_holders(pages.holders, per)
        lit = None
        if self.selected is not None:
            mask = np.zeros(pages.num_pages, bool)
            mask[pages.request_pages.get(self.selected, np.zeros(0, np.int64))] = True
            lit = cell_any(mask, per)

        def colour(i: int) -> str:
            c = state_colour(int(state[i]), int(holder[i]), int(holders[i]))
            return c if lit is None or lit[i] else faded(c)

        text = Text(no_wrap=True, overflow="crop")
        n = len(state)
        if grid.dense:
            for row in range(0, grid.rows, 2):
                for col in range(grid.cols):
                    top, bottom = row * grid.cols + col, (row + 1) * grid.cols + col
                    if top >= n:
                        break
                    below = colour(bottom) if bottom < n else None
                    text.append("▀", Style(color=colour(top), bgcolor=below))
                text.append("\n")
        else:
            width = len(grid.glyph)
            gap = " " * (grid.cell_width - width)
            for row in range(grid.rows):
                if row:
                    text.append("\n" * grid.row_height)
                label = str(row * grid.cols).rjust(grid.gutter - 1)
                text.append(label + " ", style="#6b7385")
                for i in range(row * grid.cols, min(n, (row + 1) * grid.cols)):
                    if state[i] == STATE_SHARED:
                        text.append(_count_label(int(holders[i]), width), _on(colour(i)))
                        text.append(gap)
                    else:
                        text.append(grid.glyph + gap, style=colour(i))
        text.rstrip()
        return text

    def _colour(self, owner: int) -> str:
        colour = owner_colour(int(owner))
        if self.selected is None or owner == self.selected:
            return colour
        return faded(colour)

    def page_at(self, x: int, y: int) -> int | None:
        """The first page shown at character (x, y) of the content, if any."""
        if self.owners is None:
            return None
        grid = self.grid()
        if grid.dense:
            cell = 2 * y * grid.cols + x
        else:
            col = (x - grid.gutter) // grid.cell_width
            if x < grid.gutter or col >= grid.cols or y % grid.row_height:
                return None
            cell = y // grid.row_height * grid.cols + col
        page = cell * grid.per_cell
        return page if 0 <= page < len(self.owners) else None

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        page = None if offset is None else self.page_at(offset.x, offset.y)
        if page is None or self.owners is None:
            return
        if self.states is not None and len(self.states.holder) == len(self.owners):
            pages = self.states.holder[page : page + self.grid().per_cell]
        else:
            pages = self.owners[page : page + self.grid().per_cell]
        held = pages[pages >= 0]
        if held.size:
            self.post_message(self.RequestClicked(int(np.bincount(held).argmax())))


def _count_label(holders: int, width: int) -> str:
    """A shared cell's text: how many requests hold it, in ``width`` characters."""
    for label in (f"×{holders}", str(holders)):
        if len(label) <= width:
            return label.center(width)
    return "+" * width


def _on(colour: str) -> Style:
    """Dark digits on the cell's colour: a block that reads as a count."""
    return Style(color=BACKGROUND.hex, bgcolor=colour, bold=True)
