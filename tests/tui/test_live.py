"""Live and attach modes: the UI follows rows a writer adds after it started, and
runs ``kvscope run``'s engine job in a worker thread (the run_tui contract)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvscope.app.cli import main as cli_main
from kvscope.app.tui import run_tui
from kvscope.app.tui.app import KvscopeApp
from kvscope.app.tui.page_grid import PageGrid
from kvscope.app.tui.quit_screen import QuitScreen
from kvscope.app.tui.requests_table import RequestsTable
from kvscope.app.tui.timeline import Timeline
from kvscope.db import queries
from kvscope.db.store import open_db
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import StepSummary
from kvscope.profiler.synthetic import SyntheticRun

from support.tui_helpers import MAIN, SMALL, aio, make_recorder, record, wait_for, wait_for_view


def runbar(app: KvscopeApp) -> str:
    return str(app.query_one("#runbar").render())


@aio
async def test_attach_follows_rows_a_writer_adds_after_start(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    recorder = make_recorder(path)
    events = SyntheticRun(recorder.start_ns, **SMALL).events
    third = len(events) // 3
    for event in events[:third]:
        recorder.on_event(event)
    recorder.flush()
    app = KvscopeApp(path, follow=True, refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await wait_for_view(pilot, app)
        assert view.run.status == "running" and app.query_one(Timeline).mode == "live"
        first = len(view.steps)
        for event in events[third : 2 * third]:
            recorder.on_event(event)
        recorder.flush()
        view = await wait_for_view(pilot, app, lambda v: len(v.steps) > first)
        assert view.index == len(view.steps) - 1  # still on the newest step
        assert app.query_one(RequestsTable).row_count == len(view.requests) > 0
        for event in events[2 * third :]:
            recorder.on_event(event)
        recorder.finish("complete")
        view = await wait_for_view(pilot, app, lambda v: v.run.status == "complete")
        assert view.row.step == max(e.step for e in events if isinstance(e, StepSummary))
        assert app.query_one(Timeline).mode == "paused"


@aio
async def test_follow_waits_for_a_first_run(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    open_db(path).conn.close()
    app = KvscopeApp(path, follow=True, refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: "waiting for a run" in runbar(app))
        run_id, _ = record(path, **SMALL)
        view = await wait_for_view(pilot, app)
        assert view.run.run_id == run_id and "waiting" not in runbar(app)


@aio
async def test_a_run_without_steps_yet_shows_placeholders(tmp_path: Path) -> None:
    path = tmp_path / "starting.db"
    recorder = make_recorder(path)  # the run exists; the engine has not stepped yet
    app = KvscopeApp(path, follow=True, refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await wait_for_view(pilot, app)
        assert view.row is None and view.run.run_id == recorder.run_id
        assert app.query_one(Timeline).step_label == "no step recorded yet"
        assert str(app.query_one("#throughput").render()) == "waiting for data"
        assert str(app.query_one(PageGrid).render()) == "no page-map snapshot recorded yet"
    recorder.finish("complete")


def engine_job(
    path: Path, step_pause_s: float = 0.01, release: threading.Event | None = None, **params: Any
):
    """A stand-in for ``kvscope run``'s workload: records a synthetic run at an
    engine's pace and stops (marking the run interrupted) when asked. With ``release``,
    it holds its last event until that is set: a test of what happens while a run
    still records then needs no guess at how long a loaded machine takes to draw."""

    def job(stop: threading.Event) -> dict[str, Any]:
        recorder = make_recorder(path, flush_interval_s=0.05)
        recorder.start()
        run = SyntheticRun(recorder.start_ns, **params)
        events = run.events
        for i, event in enumerate(events):
            while release is not None and i == len(events) - 1 and not release.wait(0.05):
                if stop.is_set():
                    break
            if stop.is_set():
                recorder.finish("interrupted")
                return {"run_id": recorder.run_id, "status": "interrupted"}
            recorder.on_event(event)
            if isinstance(event, StepSummary):
                time.sleep(step_pause_s)
        recorder.finish("complete")
        return {"run_id": recorder.run_id, "status": "complete", "steps": run.truth.steps}

    return job


@aio
async def test_job_runs_live_then_the_ui_stays_open_with_a_notice(tmp_path: Path) -> None:
    path = tmp_path / "job.db"
    older, _ = record(path, **SMALL)  # the UI must show the job's run, not this one
    app = KvscopeApp(path, job=engine_job(path, **MAIN), refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        view = await wait_for_view(pilot, app)
        assert view.run.run_id > older
        modes = set()
        while not app.job_done.is_set():
            modes.add(app.query_one(Timeline).mode)
            await pilot.pause(0.02)
        assert "live" in modes
        view = await wait_for_view(pilot, app, lambda v: v.run.status == "complete")
        assert app.job_result == {
            "run_id": view.run.run_id,
            "status": "complete",
            "steps": view.row.step + 1,
        }
        assert view.index == len(view.steps) - 1
        await wait_for(pilot, lambda: "run finished" in runbar(app))
        assert any("Run finished" in n.message for n in app._notifications)
        assert app.is_running  # stays open until the user quits
        await pilot.press("q")


@aio
async def test_quitting_early_stops_the_job(tmp_path: Path) -> None:
    path = tmp_path / "stop.db"
    # Slow steps (100+ of them, 0.3 s each): a loaded machine may take seconds to draw the
    # first screen, and the job must still be running when the user quits.
    app = KvscopeApp(path, job=engine_job(path, step_pause_s=0.3, **MAIN), refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_view(pilot, app, lambda v: v.row is not None)
        assert not app.job_done.is_set()
        await pilot.press("q")  # asks first: stop, detach or keep watching
        assert isinstance(app.screen, QuitScreen) and not app.stop.is_set()
        await pilot.press("escape")  # keep watching
        assert not isinstance(app.screen, QuitScreen) and app.is_running
        await pilot.press("q", "s")
    assert app.job_done.wait(10)
    assert app.job_result is not None and app.job_result["status"] == "interrupted"
    assert queries.run_info(path, app.job_result["run_id"]).status == "interrupted"


@aio
async def test_detaching_lets_the_job_finish_headless(tmp_path: Path) -> None:
    path = tmp_path / "detach.db"
    # The job holds its last event until released: still running when the user quits,
    # however long a loaded machine takes to draw (0.25 s steps had not been enough).
    release = threading.Event()
    app = KvscopeApp(path, job=engine_job(path, release=release, **SMALL), refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_view(pilot, app, lambda v: v.row is not None)
        assert not app.job_done.is_set()
        await pilot.press("q", "d")
    assert app.detached and not app.stop.is_set() and not app.job_done.is_set()
    release.set()
    assert app.job_done.wait(60)
    assert app.job_result is not None and app.job_result["status"] == "complete"


def test_run_tui_returns_the_jobs_result_and_reraises_its_error(
    tmp_path: Path, monkeypatch
) -> None:
    async def quit_when_done(pilot: Any) -> None:
        await wait_for(pilot, pilot.app.job_done.is_set)
        await pilot.press("q")

    original = KvscopeApp.run
    monkeypatch.setattr(
        KvscopeApp, "run", lambda self: original(self, headless=True, auto_pilot=quit_when_done)
    )
    path = tmp_path / "contract.db"
    result = run_tui(path, job=engine_job(path, step_pause_s=0, **SMALL))
    assert result is not None and result["status"] == "complete"
    assert queries.run_info(path, result["run_id"]).status == "complete"

    def failing(stop: threading.Event) -> dict[str, Any]:
        raise KvscopeError("model file not found")

    with pytest.raises(KvscopeError, match="model file not found"):
        run_tui(path, job=failing)


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("missing", [], "no database at"),
        ("empty", [], "is empty"),
        ("foreign", [], "not a kvscope database"),
        ("recorded", ["--run", "7"], "no run 7 in"),
        ("no runs", [], "holds no runs yet"),
    ],
)
def test_kvscope_tui_explains_bad_input_in_one_line(
    tmp_path: Path, capsys, setup, args, message
) -> None:
    import sqlite3

    path = tmp_path / "x.db"
    if setup == "empty":
        path.write_bytes(b"")
    elif setup == "foreign":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE t (x)")
    elif setup == "recorded":
        record(path, **SMALL)
    elif setup == "no runs":
        open_db(path).conn.close()
    assert cli_main(["tui", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_kvscope_tui_defaults_to_the_default_database(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "default.db"))
    assert cli_main(["tui"]) == 2
    assert f"no database at {tmp_path / 'default.db'}" in capsys.readouterr().err
