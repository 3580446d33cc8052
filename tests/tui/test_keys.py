"""Every key binding (and the mouse) does what the footer and help screen say."""

from __future__ import annotations

import numpy as np

from kvscope.app.tui.help_screen import HelpScreen
from kvscope.app.tui.keys import BINDINGS
from kvscope.app.tui.page_grid import PageGrid
from kvscope.app.tui.playback import SPEEDS
from kvscope.app.tui.requests_table import COLUMNS, STATE_RANK, RequestsTable
from kvscope.app.tui.run_picker import RunPicker
from kvscope.app.tui.timeline import Timeline

from support.tui_helpers import (
    Recorded,
    aio,
    goto_step,
    rich_text,
    settle,
    viewer,
    wait_for,
    wait_for_view,
)


@aio
async def test_replay_keys_move_the_position(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await wait_for_view(pilot, app)
        last = len(view.steps) - 1
        assert view.index == last and not app.follow  # a finished run opens at its end, paused
        assert app.query_one(Timeline).mode == "paused"
        await pilot.press("home")
        assert (await settle(pilot, app)).index == 0
        await pilot.press("right", "right", "right")
        assert (await settle(pilot, app)).index == 3
        await pilot.press("left")
        assert (await settle(pilot, app)).index == 2
        await pilot.press("pagedown")
        view = await settle(pilot, app)
        assert view.t_s >= 0.1 * view.steps.end_s and 2 < view.index < last
        index = view.index
        await pilot.press("pageup")
        assert (await settle(pilot, app)).index < index
        await pilot.press("end")
        assert (await settle(pilot, app)).index == last
        await pilot.press("right")  # past the end: stays
        assert (await settle(pilot, app)).index == last
        label = app.query_one(Timeline).step_label
        assert label == f"step {view.steps.steps[last]} ({last + 1}/{last + 1})"


@aio
async def test_space_plays_and_pauses_and_speed_keys_change_speed(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await wait_for_view(pilot, app)
        app.speed = speed = 1.0
        await pilot.press("plus")
        assert app.speed == SPEEDS[SPEEDS.index(speed) + 1]
        await pilot.press("minus", "minus")
        assert app.speed == SPEEDS[SPEEDS.index(speed) - 1]
        # Plays the whole run in about ten seconds: a loaded machine reads the database
        # a few times a second at best, and the test needs a read between start and end.
        app.speed = view.steps.end_s / 10
        await pilot.press("space")  # at the end of a finished run: plays from the start
        assert app.playing and app.query_one(Timeline).mode == "playing"
        await wait_for(
            pilot, lambda: app.view.index > 0 and app.view.index < len(app.view.steps) - 1
        )
        await pilot.press("space")
        assert not app.playing and app.query_one(Timeline).mode == "paused"
        paused_at = (await settle(pilot, app)).index
        await pilot.pause(0.3)
        assert app.view.index == paused_at
        await pilot.press("space")
        await wait_for(pilot, lambda: not app.playing)  # plays to the end, then stops
        assert (await settle(pilot, app)).index == len(view.steps) - 1


@aio
async def test_clicking_the_timeline_seeks(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await wait_for_view(pilot, app)
        timeline = app.query_one(Timeline)
        start = timeline._prefix().cell_len
        await pilot.click(Timeline, offset=(start + timeline._bar_width() // 2, 0))
        view = await settle(pilot, app)
        assert abs(view.t_s - view.steps.end_s / 2) < 0.1 * view.steps.end_s


@aio
async def test_selecting_a_request_highlights_its_pages(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await goto_step(pilot, app, 60)
        table = app.query_one(RequestsTable)
        holder = next(r for r in view.requests if r.pages > 1)
        table.move_cursor(row=table.get_row_index(str(holder.request_id)))
        await pilot.press("enter")
        assert app.selected_request == holder.request_id
        page_map = app.query_one(PageGrid)
        assert page_map.selected == holder.request_id
        colours = _cell_colours(page_map)
        own = colours[view.pages == holder.request_id]
        others = colours[(view.pages >= 0) & (view.pages != holder.request_id)]
        assert len(set(own)) == 1 and own[0] not in set(others)  # its pages stand out, others fade
        legend = app.query_one("#legend").render()
        assert f"request {holder.request_id} selected: {holder.pages} pages" in str(legend)
        await pilot.press("escape")
        assert app.selected_request is None and page_map.selected is None


def _cell_colours(page_map: PageGrid) -> np.ndarray:
    """The colour of each page's cell as drawn (one page per cell at this size)."""
    text = page_map.render()
    colours = [
        str(span.style) for span in text.spans if text.plain[span.start : span.end].startswith("▆")
    ]
    assert len(colours) == len(page_map.owners)
    return np.array(colours)


@aio
async def test_clicking_a_page_selects_its_request(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await goto_step(pilot, app, 60)
        page_map = app.query_one(PageGrid)
        page = int(np.flatnonzero(view.pages >= 0)[0])
        grid = page_map.grid()
        x = grid.gutter + (page % grid.cols) * grid.cell_width
        y = (page // grid.cols) * grid.row_height
        assert page_map.page_at(x, y) == page
        await pilot.click(PageGrid, offset=(x + page_map.region.x - page_map.content_region.x, y))
        assert app.selected_request == int(view.pages[page])
        table = app.query_one(RequestsTable)
        assert table.cursor_request() == int(view.pages[page])


@aio
async def test_sort_key_and_header_clicks_order_the_requests(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        await goto_step(pilot, app, 60)
        table = app.query_one(RequestsTable)

        shown = [c.key.value for c in table.ordered_columns]  # the columns that fit

        def column(key: str) -> list:
            index = shown.index(key)
            return [table.get_row(row.key)[index].plain for row in table.ordered_rows]

        def header(key: str) -> tuple[int, int]:  # a cell of its header, inside the border
            before = table.ordered_columns[: shown.index(key)]
            return (2 + sum(c.get_render_width(table) for c in before), 1)

        # Default: by state, requests holding the cache first, then by id.
        assert COLUMNS[table.sort_column].key == "state"
        states = column("state")
        assert states == sorted(states, key=STATE_RANK.__getitem__) and states[0] == "running"
        assert len(set(states)) > 1
        await pilot.press("s")  # next column: prompt tokens
        assert COLUMNS[table.sort_column].key == "prompt_tokens"
        prompts = [int(v) for v in column("prompt_tokens")]
        assert prompts == sorted(prompts)
        await pilot.click(
            RequestsTable, offset=header("prompt_tokens")
        )  # the sorted column again: reverse
        assert table.sort_reverse
        assert [int(v) for v in column("prompt_tokens")] == sorted(prompts, reverse=True)
        await pilot.click(RequestsTable, offset=header("ttft_s"))
        assert COLUMNS[table.sort_column].key == "ttft_s"


@aio
async def test_help_screen_lists_every_binding(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_view(pilot, app)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = rich_text(app.screen.query_one("#help Static").content, 120)
        for binding in BINDINGS:
            assert binding.description in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        footer = {b.description for b in BINDINGS if b.show}
        assert {"Play/pause", "Step", "Help", "Quit", "Runs"} <= footer


@aio
async def test_run_picker_switches_the_run(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await wait_for_view(pilot, app)
        assert view.run.run_id == recorded.run_id  # the newest run by default
        await pilot.press("r")
        assert isinstance(app.screen, RunPicker)
        await pilot.press("down", "enter")  # runs are listed newest first
        view = await wait_for_view(pilot, app, lambda v: v.run.run_id == recorded.small_id)
        assert len(view.requests) == recorded.small.truth.requests
        assert view.index == len(view.steps) - 1
        await pilot.press("r", "escape")
        assert not isinstance(app.screen, RunPicker) and app.run_id == recorded.small_id


@aio
async def test_q_quits(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_view(pilot, app)
        await pilot.press("q")
        await pilot.pause()
        assert app._exit and app.stop.is_set()


def test_docs_list_every_binding() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "tui.md").read_text()
    for binding in BINDINGS:
        assert binding.description in docs, binding.description
        assert f"`{binding.key_display or binding.key}`" in docs, binding.key
