"""The help screen scrolls with PgUp/PgDn/Home/End as well as the arrows: the replay's
priority keys yield to it while it is open, and the replay stays where it was."""

from __future__ import annotations

from kvscope.app.tui.help_screen import HelpScreen

from support.tui_helpers import Recorded, aio, goto_step, settle, viewer


@aio
async def test_page_keys_scroll_the_help_screen_not_the_replay(recorded: Recorded) -> None:
    app = viewer(recorded)
    async with app.run_test(size=(80, 24)) as pilot:
        view = await goto_step(pilot, app, 60)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        scroll = app.screen.query_one("#help")
        assert scroll.max_scroll_y > 0  # at 80x24 the help is taller than the screen
        await pilot.press("pagedown")
        await pilot.pause()
        assert scroll.scroll_target_y > 0 or scroll.scroll_y > 0
        await pilot.press("end")
        await pilot.pause()
        assert scroll.scroll_target_y == scroll.max_scroll_y
        await pilot.press("pageup")
        await pilot.pause()
        assert scroll.scroll_target_y < scroll.max_scroll_y
        await pilot.press("home")
        await pilot.pause()
        assert scroll.scroll_target_y == 0
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        assert app.view.row.step == view.row.step == 60  # the replay did not move
        # and with the help closed the same keys move the replay again
        await pilot.press("end")
        moved = await settle(pilot, app)
        assert moved.row.step == moved.steps.steps[-1] > 60
