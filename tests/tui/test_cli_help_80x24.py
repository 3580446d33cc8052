"""The help screen at 80x24: taller than the terminal, it says so and scrolls to its last line."""

from __future__ import annotations

from textual.containers import VerticalScroll

from kvscope.app.tui.help_screen import HelpScreen

from support.tui_helpers import Recorded, aio, viewer, wait_for_view


@aio
async def test_help_screen_scrolls_to_its_end_at_80x24(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_view(pilot, app)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        scroll = app.screen.query_one("#help", VerticalScroll)
        assert scroll.outer_size.height <= 24
        assert scroll.max_scroll_y > 0  # more than fits: hence the subtitle
        assert "scroll" in str(scroll.border_subtitle) and "close" in str(scroll.border_subtitle)
        assert app.focused is scroll
        for _ in range(scroll.max_scroll_y + 5):  # the arrows (PgDn/End: test_help_scroll.py)
            await pilot.press("down")
        await pilot.pause(0.5)
        assert scroll.scroll_y == scroll.max_scroll_y  # the last line is reachable
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
