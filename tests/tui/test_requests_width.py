"""The requests table fits its panel: no horizontal scrolling at 140 columns (its
columns narrow, and at narrower widths the least useful ones give way)."""

from __future__ import annotations

import pytest

from kvscope.app.tui.requests_table import COLUMNS, RequestsTable

from support.tui_helpers import Recorded, aio, goto_step, viewer


@pytest.mark.parametrize("size", [(140, 40), (120, 40), (100, 30), (80, 24), (200, 50)])
@aio
async def test_the_requests_table_fits_without_horizontal_scrolling(
    recorded: Recorded, size: tuple[int, int]
) -> None:
    app = viewer(recorded)
    async with app.run_test(size=size) as pilot:
        await goto_step(pilot, app, 60)
        table = app.query_one(RequestsTable)
        assert table.row_count > 0
        width = table.scrollable_content_region.width
        assert table.virtual_size.width <= width, (table.virtual_size.width, width)
        assert table.max_scroll_x == 0
        labels = [str(c.label).strip(" ▲▼") for c in table.columns.values()]
        # the figures that say what a request holds and why it missed stay at 140 columns
        if size[0] >= 140:
            assert {"missed", "shr pg", "frees", "prompt", "pages", "TTFT"} <= set(labels), labels
        # the columns left out are named, and come back when the panel is wide enough
        hidden = len(COLUMNS) - len(labels)
        assert (table.border_subtitle != "") == (hidden > 0)
        if size[0] >= 200:
            assert hidden == 0
