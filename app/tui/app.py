"""The kvscope terminal UI: one app for a live run, an attached run and a replay.

Every figure comes from the database through ``RunReader`` (app/tui/data.py),
read in a thread worker a few times a second; between reads the UI sleeps.
Reading and drawing spend from a ``CpuBudget``, so a large run makes the UI
refresh less often instead of taking a core from the engine. The shown
position (``Playback``) is either the newest recorded step (live) or a time in
the run (replay): that is the only difference between watching, attaching and
replaying.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from kvscope.app.tui import fmt
from kvscope.app.tui.cpu_budget import LIVE_DUTY, REPLAY_DUTY, CpuBudget
from kvscope.app.tui.data import RunReader, View
from kvscope.app.tui.help_screen import HelpScreen
from kvscope.app.tui.job import Job
from kvscope.app.tui.keys import BINDINGS
from kvscope.app.tui.legend import Legend, legend_text
from kvscope.app.tui.page_grid import PageGrid
from kvscope.app.tui.panels import (
    Panel,
    churn_text,
    fragmentation_text,
    gpu_text,
    infllm_text,
    kernels_table,
    prefix_text,
    throughput_text,
)
from kvscope.app.tui.playback import Playback, default_speed
from kvscope.app.tui.quit_screen import DETACH, STOP, QuitScreen
from kvscope.app.tui.requests_table import RequestsTable
from kvscope.app.tui.run_picker import RunPicker
from kvscope.app.tui.timeline import Timeline
from kvscope.app.tui.watch_view import WatchView
from kvscope.db import queries
from kvscope.db.schema import RUNNING
from kvscope.engine.errors import KvscopeError

# Key actions that act on an engine run's steps and requests (not on a watched deployment).
ENGINE_RUN_ACTIONS = frozenset(
    {"toggle_play", "step", "jump", "seek_start", "seek_end", "speed", "sort", "unselect"}
)

# Seconds between database reads.
REFRESH_S = 0.5
# Narrower terminals stack the panels in fewer columns.
NARROW_COLS = 120


class Loaded(Message):
    """A read finished: a View, a line to show while there is nothing to view, or
    None when nothing changed since the previous read."""

    def __init__(self, outcome: View | str | None, cpu_s: float) -> None:
        super().__init__()
        self.outcome = outcome
        self.cpu_s = cpu_s  # CPU the read took in the worker thread


class JobEnded(Message):
    """The engine job returned (or raised: ``KvscopeApp.job_error``)."""


class KvscopeApp(App[None]):
    """Watch a run's KV cache: live while ``job`` runs, or from a database."""

    CSS_PATH = "tui.tcss"
    TITLE = "kvscope"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [*BINDINGS, ("ctrl+c", "quit", "Quit")]

    selected_request: reactive[int | None] = reactive(None)
    """The request whose pages the map highlights."""

    def __init__(
        self,
        db_path: str | Path,
        run_id: int | None = None,
        follow: bool = True,
        job: Job | None = None,
        refresh_s: float = REFRESH_S,
    ) -> None:
        super().__init__()
        self.db_path = Path(db_path)
        self.refresh_s = refresh_s
        self.run_id: int | None = None  # the run on screen; None until one is found
        self.view: View | None = None
        self.playback = Playback(follow)
        self.stop = threading.Event()
        self.job_result: dict[str, Any] | None = None
        self.job_error: BaseException | None = None
        self.job_done = threading.Event()
        self.job_started = False
        self.detached = False  # quit chose to let the job finish without the UI
        self._job = job
        self._asked_run = run_id
        self._reader = RunReader(self.db_path)
        self._baseline_run = 0  # with a job: the newest run before it started
        self._read_note = ""  # why there is nothing to show (waiting, unreadable database)
        self._job_note = ""  # how the engine job ended
        self._loading = False
        self._pending = False
        self._last_key: tuple | None = None
        self._budget = CpuBudget()
        self._last_tick = time.monotonic()

    # The playback state, as attributes (scripts and tests set them).

    @property
    def follow(self) -> bool:
        """The position tracks the newest recorded step (live)."""
        return self.playback.follow

    @property
    def playing(self) -> bool:
        """A replay advances the position by ``speed`` run-seconds per wall second."""
        return self.playback.playing

    @property
    def speed(self) -> float:
        """Replay speed, one of playback.SPEEDS."""
        return self.playback.speed

    @speed.setter
    def speed(self, speed: float) -> None:
        self.playback.speed = speed
        self._show_timeline()

    @property
    def position_s(self) -> float | None:
        """Run seconds of the shown step while not following; None: the newest step."""
        return self.playback.position_s

    # --- layout -------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="runbar")
        # A watched deployment (run kind ``watch``) has no steps or pages of
        # kvscope's own: its view replaces the body and the timeline.
        yield VerticalScroll(id="watch-body")
        with VerticalScroll(id="body"):
            with Horizontal(id="top"):
                with Vertical(id="map-panel"):
                    yield PageGrid(id="pagemap")
                    yield Legend(id="legend")
                with Vertical(id="side"):
                    yield Panel("Throughput", throughput_text, id="throughput")
                    yield Panel("Prefix cache", prefix_text, id="prefix")
            with Horizontal(id="middle"):
                yield Panel("Fragmentation", fragmentation_text, id="fragmentation")
                yield Panel("Eviction · offload · preemption", churn_text, id="churn")
                yield Panel("GPU", gpu_text, id="gpu")
            # InfLLM runs only: the selected request's retrievals.
            yield Panel(
                "InfLLM retrieval · distant blocks x recent steps",
                lambda view, width: infllm_text(view, width, self.selected_request),
                id="infllm",
            )
            with Horizontal(id="bottom"):
                yield RequestsTable(id="requests")
                yield Panel("Kernels", lambda view, width: kernels_table(view), id="kernels")
        yield Timeline(id="timeline")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#map-panel").border_title = "Page occupancy"
        self.query_one(RequestsTable).focus(scroll_visible=False)  # keep the page map in view
        self._fit_layout()
        self._show_runbar()
        if self._job is not None:
            # The newest run before the job starts: the job's run is the next one.
            try:
                if self._reader.ready():
                    self._baseline_run = self._reader.newest_run() or 0
            except (KvscopeError, sqlite3.Error):
                pass
            self.job_started = True
            self.run_worker(self._run_job, thread=True, group="job", name="engine")
        self.set_interval(self.refresh_s, self._tick)
        self._read()

    def on_resize(self) -> None:
        self._fit_layout()

    def _fit_layout(self) -> None:
        self.screen.set_class(self.size.width < NARROW_COLS, "-narrow")

    # --- the engine job ---------------------------------------------------------------

    def _run_job(self) -> None:
        assert self._job is not None
        try:
            self.job_result = self._job(self.stop)
        except BaseException as exc:  # shown, then re-raised by run_tui after the UI closes
            self.job_error = exc
        finally:
            self.job_done.set()
            self.post_message(JobEnded())

    def on_job_ended(self) -> None:
        if self.job_error is not None:
            self._job_note = f"run failed: {self.job_error}"
            self.notify(str(self.job_error), title="Run failed", severity="error", timeout=30)
        elif self.stop.is_set():
            self._job_note = "run stopped"
        else:
            self._job_note = "run finished · q to quit"
            self.notify("Run finished. Press q to quit.", title="kvscope", timeout=30)
        self._show_runbar()
        self._read()

    # --- reading the database ----------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        wall_s, self._last_tick = now - self._last_tick, now
        duty = None  # starting up and waiting for a run are not charged
        if self.view is not None:
            duty = LIVE_DUTY if self._job is not None or self._live() else REPLAY_DUTY
        if self.playing and self.view is not None:
            self.playback.advance(wall_s, self.view.steps.end_s, self._live())
            self._show_timeline()
        if self._budget.tick(wall_s, duty):
            self._read()

    def _read(self) -> None:
        """Read the position now, or as soon as the read in flight returns."""
        if self._loading:
            self._pending = True
            return
        self._loading = True
        self._load(self.run_id, self.playback.wanted_s())

    @work(thread=True, group="load")
    def _load(self, run_id: int | None, position_s: float | None) -> None:
        started = time.thread_time()
        try:
            outcome = self._fetch(run_id, position_s)
        except (KvscopeError, sqlite3.Error) as exc:
            outcome = f"cannot read {self.db_path}: {exc}"
        self.post_message(Loaded(outcome, time.thread_time() - started))

    def _fetch(self, run_id: int | None, position_s: float | None) -> View | str | None:
        """Runs in the worker thread; the reader is only ever used there."""
        reader = self._reader
        if not reader.ready():
            return f"waiting for {self.db_path} to be created"
        if run_id is None:
            run_id = self._asked_run or reader.newest_run(after=self._baseline_run)
        if run_id is None:
            # kvscope run creates its run once the model has loaded (15-30 s on a CPU).
            return (
                f"waiting for a run in {self.db_path} (a starting kvscope run is loading its model)"
            )
        progress = queries.latest_step(reader.conn, run_id)
        key = (run_id, position_s, progress.step, progress.events_written, progress.status)
        if key == self._last_key:
            return None
        view = reader.view(run_id, position_s)
        self._last_key = key
        return view

    def on_loaded(self, message: Loaded) -> None:
        self._loading = False
        self._budget.charge_read(message.cpu_s)
        if isinstance(message.outcome, View):
            self._show(message.outcome)
        elif isinstance(message.outcome, str):
            self._read_note = message.outcome
            self._show_runbar()
        if self._pending:
            self._pending = False
            self._read()

    # --- showing a view ---------------------------------------------------------------

    def _show(self, view: View) -> None:
        first = self.view is None or self.view.run.run_id != view.run.run_id
        self.view = view
        self.run_id = view.run.run_id
        self._read_note = ""
        if first:
            self.refresh_bindings()  # a watch run hides the playback keys (check_action)
            self.call_after_refresh(self._budget.restart)  # building the screen is not a refresh
            self.playback.speed = default_speed(view.steps.end_s)
            if not self.follow:
                self.playback.position_s = view.t_s
        self._show_watch(view)
        self.query_one("#infllm").display = view.retrievals is not None
        for panel in self.query(Panel):
            panel.view = view
        self._show_page_map(view)
        self.query_one(RequestsTable).requests = tuple(view.requests)
        self._show_timeline()
        self._show_runbar()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A watched deployment has no steps to play or requests to sort: hide those keys.
        Nor while a dialog is open (help, runs, quit): its own keys go first, so the replay
        keys that take priority (PgUp/PgDn/Home/End, arrows, space) reach it instead."""
        watched = self.view is not None and self.view.run.kind == "watch"
        dialog = isinstance(self.screen, ModalScreen)
        return not ((watched or dialog) and action in ENGINE_RUN_ACTIONS)

    def _show_watch(self, view: View) -> None:
        """Mount the watch view for a watch run (once per run); show the engine body otherwise."""
        watched = view.run.kind == "watch"
        host = self.query_one("#watch-body", VerticalScroll)
        if watched:
            mounted = host.query(WatchView)
            if not mounted or mounted.first().run_id != view.run.run_id:
                host.remove_children()
                host.mount(WatchView(self.db_path, view.run.run_id, id="watch"))
        elif host.children:
            host.remove_children()
        host.display = watched
        self.query_one("#body").display = not watched
        self.query_one(Timeline).display = not watched

    def _show_page_map(self, view: View) -> None:
        page_map = self.query_one(PageGrid)
        shown, states = page_map.owners, view.page_states
        changed = shown is None or view.pages is None or not np.array_equal(shown, view.pages)
        if not changed and states is not None:
            before = page_map.states
            changed = before is None or not (
                np.array_equal(before.state, states.state)
                and np.array_equal(before.holders, states.holders)
            )
        if changed:  # repainted only when a page changed hands
            page_map.states = states
            page_map.owners = view.pages
        self._show_legend()

    def _show_legend(self) -> None:
        view = self.view
        mapped = view is not None and view.page_map is not None
        per_cell = self.query_one(PageGrid).grid().per_cell if mapped else 1
        self.query_one(Legend).show(legend_text(view, per_cell, self.selected_request))

    def _show_timeline(self) -> None:
        timeline, view = self.query_one(Timeline), self.view
        if view is None:
            timeline.mode = "waiting"
            return
        timeline.mode = self.playback.mode(view.run.status == RUNNING)
        timeline.speed = self.speed
        timeline.end_s = view.steps.end_s
        timeline.position_s = view.t_s if self.follow else (self.position_s or 0.0)
        if view.row is None:
            timeline.step_label = "no step recorded yet"
        else:
            timeline.step_label = f"step {view.row.step} ({view.index + 1}/{len(view.steps)})"

    def _show_runbar(self) -> None:
        text = Text.assemble((" kvscope ", "bold #1c1f26 on #5e9fd0"))
        view = self.view
        if view is not None:
            run = view.run
            text.append(f" run {run.run_id} ", style="bold #e5e9f0")
            text.append(f"{run.kind}", style="#c0c8d4")
            if run.subject and run.subject != run.kind:
                text.append(f" · {run.subject}", style="#c0c8d4")
            text.append(f" · {run.status}", style="#edc948" if run.status == RUNNING else "#8c9bb0")
            if run.kind != "watch":  # a watched deployment's requests are not recorded
                text.append(f" · {fmt.count(run.requests)} requests", style="#c0c8d4")
        text.append(f"  {self.db_path.name}", style="#6b7385")
        for note in (self._read_note, self._job_note):
            if note:
                text.append(f"  {note}", style="bold #edc948")
        self.query_one("#runbar", Static).update(text, layout=False)

    # --- selection -------------------------------------------------------------------

    def watch_selected_request(self, request_id: int | None) -> None:
        self.query_one(PageGrid).selected = request_id
        self.query_one("#infllm").refresh()
        if self.view is not None:
            self._show_legend()
        table = self.query_one(RequestsTable)
        if request_id is not None and str(request_id) in table.rows:
            table.move_cursor(row=table.get_row_index(str(request_id)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.selected_request = int(event.row_key.value)

    def on_page_grid_request_clicked(self, message: PageGrid.RequestClicked) -> None:
        self.selected_request = message.request_id

    def action_unselect(self) -> None:
        self.selected_request = None

    def action_sort(self) -> None:
        self.query_one(RequestsTable).sort_next()

    # --- position and playback ---------------------------------------------------------

    def _live(self) -> bool:
        return self.view is not None and self.view.run.status == RUNNING

    def _moved(self) -> None:
        """The position changed: show it and read it."""
        self._show_timeline()
        self._read()

    def _seek(self, t_s: float) -> None:
        """Show the step at ``t_s`` and stay there (pauses playback and following)."""
        self.playback.seek(t_s, self.view.steps.end_s if self.view else 0.0)
        self._moved()

    def show_step(self, step: int) -> None:
        """Pause the replay at ``step`` (or the last recorded step before it): for
        scripts, such as the screenshot generator."""
        if self.view is not None and self.view.steps:
            steps = self.view.steps
            self._seek(steps.t_s[steps.index_of_step(step)])

    def action_toggle_play(self) -> None:
        if self.view is None:
            return
        self.playback.toggle(self.view.t_s, self.view.steps.end_s, self._live())
        self._last_tick = time.monotonic()
        self._moved()

    def action_step(self, delta: int) -> None:
        if self.view is not None and self.view.steps:
            self.playback.step(self.view.steps, delta, self.view.t_s)
            self._moved()

    def action_jump(self, fraction: float) -> None:
        if self.view is not None:
            view = self.view
            self._seek(self.playback.current_s(view.t_s) + fraction * view.steps.end_s)

    def action_seek_start(self) -> None:
        self._seek(0.0)

    def action_seek_end(self) -> None:
        if self.view is not None:
            self.playback.seek_end(self.view.steps.end_s, self._live())
            self._moved()

    def action_speed(self, delta: int) -> None:
        self.playback.change_speed(delta)
        self._show_timeline()

    def on_timeline_seek(self, message: Timeline.Seek) -> None:
        if self.view is not None:
            self._seek(message.fraction * self.view.steps.end_s)

    # --- screens and quitting ----------------------------------------------------------

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_switch_run(self) -> None:
        try:
            runs = queries.list_runs(self.db_path)
        except (KvscopeError, sqlite3.Error) as exc:
            self.notify(str(exc), severity="error")
            return
        if not runs:
            self.notify("no runs in this database yet")
            return
        live = {run.run_id for run in runs if run.status == RUNNING}
        self.push_screen(RunPicker(runs, self.run_id), lambda chosen: self._switch_to(chosen, live))

    def _switch_to(self, run_id: int | None, live: set[int]) -> None:
        """Show another run: a live one followed, a finished one at its end."""
        if run_id is None or run_id == self.run_id:
            return
        self._asked_run = self.run_id = run_id
        self.view = None
        self.selected_request = None
        self.playback.reset(follow=run_id in live)
        self._moved()

    async def action_quit(self) -> None:
        if self._job is not None and self.job_started and not self.job_done.is_set():
            if not isinstance(self.screen, QuitScreen):
                self.push_screen(QuitScreen(), self._quit_chosen)  # ask before ending the run
            return
        self.stop.set()  # a running job stops and marks its run interrupted
        self.exit()

    def _quit_chosen(self, choice: str | None) -> None:
        if choice == DETACH:
            self.detached = True  # run_tui waits for the job headless
            self.exit()
        elif choice == STOP:
            self.stop.set()
            self.exit()

    def on_unmount(self) -> None:
        if not self.detached:
            self.stop.set()
