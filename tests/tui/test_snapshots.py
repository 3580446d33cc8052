"""The look of the main screen (wide and 80x24) and the help screen, pinned.

Regenerate after an intended change with ``pytest tests/tui --snapshot-update``
and review the SVGs in tests/tui/__snapshots__.
"""

from __future__ import annotations

from support.tui_helpers import Recorded, goto_step, viewer

STEP = 60  # mid-run: requests running and preempted, pages evicted and offloaded


def _at_step(app):
    async def run_before(pilot) -> None:
        await goto_step(pilot, app, STEP)

    return run_before


def test_main_screen(snap_compare, recorded: Recorded) -> None:
    app = viewer(recorded)
    assert snap_compare(app, terminal_size=(140, 42), run_before=_at_step(app))


def test_main_screen_at_80x24(snap_compare, recorded: Recorded) -> None:
    app = viewer(recorded)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_at_step(app))


def test_help_screen(snap_compare, recorded: Recorded) -> None:
    app = viewer(recorded)
    assert snap_compare(
        app, press=["question_mark"], terminal_size=(140, 42), run_before=_at_step(app)
    )
