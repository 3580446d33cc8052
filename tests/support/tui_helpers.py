"""Recording databases with known contents, and helpers to drive the TUI over them.

The database holds two synthetic runs recorded through the real Recorder:
run 1 (small) and run 2 (the one the tests check: page pressure, so it has
evictions, offloads, reloads and preemptions, and GPU samples). Hardware is
fixed so kernel "% of peak" figures and snapshots are the same on any machine.
"""

from __future__ import annotations

import asyncio
import functools
import io
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from kvscope.app.tui.app import KvscopeApp
from kvscope.app.tui.data import View
from kvscope.profiler.recorder import Recorder
from kvscope.profiler.synthetic import SyntheticRun

HARDWARE = {"machine": "test", "cpu": "test", "gpus": [], "peak_tflops": 0.5, "peak_gbps": 20.0}
VERSIONS = {"kvscope": "test"}
SMALL = {"num_requests": 8, "num_pages": 64, "seed": 3}
MAIN = {"num_requests": 30, "num_pages": 24, "seed": 1, "gpu": True}


def make_recorder(path: Path, **kw: Any) -> Recorder:
    return Recorder(
        path,
        {"synthetic": True},
        "synthetic",
        "synthetic",
        hardware=HARDWARE,
        versions=VERSIONS,
        **kw,
    )


def record(path: Path, **params: Any) -> tuple[int, SyntheticRun]:
    """Record a synthetic run into ``path``; returns (run id, the run and its truth)."""
    recorder = make_recorder(path)
    run = SyntheticRun(recorder.start_ns, **params)
    for event in run.events:
        recorder.on_event(event)
    recorder.finish("complete")
    return recorder.run_id, run


class Recorded:
    """The shared database: its path, the checked run's id and its synthetic truth."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.small_id, self.small = record(path, **SMALL)
        self.run_id, self.run = record(path, **MAIN)


def aio(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test (Textual's Pilot is async) without an async pytest plugin."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def wait_for(pilot: Any, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Let the app run until ``condition()`` holds (reads happen in a worker thread).

    Sleeps rather than ``pilot.pause``: the app charges CPU spent on its thread
    to its refresh budget, and a tight pause loop would spend it.
    """
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("the TUI did not reach the expected state in time")
        await asyncio.sleep(0.02)


async def wait_for_view(
    pilot: Any, app: KvscopeApp, check: Callable[[View], bool] = lambda view: True
) -> View:
    """Wait until the app shows a view that passes ``check``; returns it."""
    await wait_for(pilot, lambda: app.view is not None and check(app.view))
    await pilot.pause()
    assert app.view is not None
    return app.view


async def settle(pilot: Any, app: KvscopeApp) -> View:
    """Wait until the shown view is the one at the app's current position."""

    def shown() -> bool:
        view = app.view
        if view is None or app._loading:
            return False
        wanted = len(view.steps) - 1 if app.follow else view.steps.index_at(app.position_s or 0)
        return view.index == wanted

    await wait_for(pilot, shown)
    await pilot.pause()
    assert app.view is not None
    return app.view


async def goto_step(pilot: Any, app: KvscopeApp, step: int) -> View:
    """Move the replay to ``step`` as a user would: click the timeline near it, then
    step with the arrow keys."""
    from kvscope.app.tui.timeline import Timeline

    view = await wait_for_view(pilot, app)
    timeline = app.query_one(Timeline)
    fraction = view.steps.t_s[view.steps.steps.index(step)] / view.steps.end_s
    x = timeline._prefix().cell_len + round(fraction * (timeline._bar_width() - 1))
    await pilot.click(Timeline, offset=(x, 0))
    view = await settle(pilot, app)
    while view.row is not None and view.row.step != step:
        await pilot.press("right" if step > view.row.step else "left")
        view = await settle(pilot, app)
    return view


def rich_text(renderable: Any, width: int) -> str:
    """A Rich renderable as plain text ``width`` columns wide."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def viewer(recorded: Recorded, **kw: Any) -> KvscopeApp:
    """The TUI on the shared database, opened for replay at the checked run's end."""
    kw.setdefault("follow", False)
    kw.setdefault("refresh_s", 0.05)
    return KvscopeApp(recorded.path, **kw)
