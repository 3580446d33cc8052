"""Pure pieces of the widgets: the page grid's layout and aggregation, sparklines,
number formats, and the requests table's row cap."""

from __future__ import annotations

import pytest

from kvscope.app.tui import fmt, requests_table
from kvscope.app.tui.page_grid import CELL_SHAPES, plan_grid
from kvscope.app.tui.requests_table import RequestsTable

from support.tui_helpers import Recorded, aio, goto_step, viewer


@pytest.mark.parametrize(
    ("pages", "size", "glyph", "per_cell"),
    [
        (34, (100, 11), CELL_SHAPES[0][0], 1),  # a small pool: big cells
        (500, (100, 11), "■", 1),
        (1024, (100, 11), "", 1),  # half blocks: two cells per character
        (20_000, (100, 11), "", 10),  # more pages than cells: aggregated
    ],
)
def test_plan_grid_picks_the_largest_cells_that_fit(pages, size, glyph, per_cell) -> None:
    grid = plan_grid(pages, *size)
    assert grid.glyph == glyph and grid.per_cell == per_cell
    assert grid.cols * grid.rows * grid.per_cell >= pages
    lines = (
        grid.rows * grid.row_height - (grid.row_height - 1)
        if not grid.dense
        else -(-grid.rows // 2)
    )
    assert lines <= size[1] and grid.gutter + grid.cols * grid.cell_width <= size[0]
    if not grid.dense and grid.cols >= 8:
        assert grid.cols % 8 == 0  # rows start at round page numbers


def test_spark_scales_to_the_largest_value_or_a_fixed_top() -> None:
    assert fmt.spark([0, 1, 2, 4], 4) == "▁▃▅█"
    assert fmt.spark([0.5, None, 1.0], 3, top=1.0) == "▅ █"
    assert fmt.spark([1, 2, 3, 4, 5], 2) == "▇█"  # the newest values that fit
    assert fmt.spark([0, 0], 2) == "▁▁" and fmt.spark([], 5) == ""


def test_formats_never_print_none() -> None:
    assert [fmt.pct(None), fmt.count(None), fmt.rate(None), fmt.seconds(None)] == [fmt.MISSING] * 4
    assert fmt.pct(0.2911) == "29.1%" and fmt.count(12345) == "12,345"
    assert fmt.rate(2218.7, " t/s") == "2.2k t/s" and fmt.rate(42.46) == "42.5/s"
    assert (
        fmt.seconds(4e-4) == "400 µs"
        and fmt.seconds(0.0123) == "12.3 ms"
        and fmt.seconds(3.5) == "3.50 s"
    )


@aio
async def test_requests_table_shows_the_first_rows_in_order(
    recorded: Recorded, monkeypatch
) -> None:
    monkeypatch.setattr(requests_table, "MAX_ROWS", 10)
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await goto_step(pilot, app, 60)
        table = app.query_one(RequestsTable)
        assert table.row_count == 10 < len(view.requests)
        assert [int(row.key.value) for row in table.ordered_rows] == [
            r.request_id for r in table.ordered()[:10]
        ]
        assert table.border_title == f"Requests · first 10 of {len(view.requests)}"
