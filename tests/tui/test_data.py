"""The TUI's data layer against a recording whose true counts are known."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from kvscope.app.tui.data import RunReader, check_database
from kvscope.db import queries
from kvscope.db.pages import PAGE_OFFLOADED
from kvscope.db.requests import request_progress
from kvscope.db.source import Position
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import PAGE_EVICTED, PAGE_FREE

from support.tui_helpers import MAIN, Recorded, record


@pytest.fixture(scope="module")
def reader(recorded: Recorded) -> RunReader:
    reader = RunReader(recorded.path)
    assert reader.ready()
    yield reader
    reader.close()


def test_view_at_the_end_holds_the_runs_true_counts(recorded: Recorded, reader: RunReader) -> None:
    truth = recorded.run.truth
    view = reader.view(recorded.run_id, None)
    assert view.row is not None and view.row.step == truth.steps - 1
    assert view.total.churn == {
        "page_evicted": truth.evicted_pages,
        "page_offloaded": truth.offloaded_pages,
        "page_reloaded": truth.reloaded_pages,
        "request_preempted": truth.preemptions,
    }
    assert truth.preemptions > 0 and truth.reloaded_pages > 0  # the fixture exercises every panel
    assert view.total.prefix_queried_tokens == truth.prefix_queried_tokens
    assert view.total.prefix_hit_tokens == truth.prefix_hit_tokens
    assert {k.name: k.calls for k in view.kernels} == truth.kernel_calls
    assert len(view.requests) == truth.requests
    assert sum(r.output_tokens or 0 for r in view.requests) == truth.output_tokens
    assert all(r.state == "finished" for r in view.requests)
    assert view.gpu and view.gpu[-1].utilization_pct == 50.0


def test_page_map_is_exact_at_every_step(recorded: Recorded, reader: RunReader, tmp_path) -> None:
    """Snapshots come every 5 steps; the TUI brings the last one forward through the
    page events. The same run recorded with a snapshot at every step is the truth."""
    exact_path = tmp_path / "every-step.db"
    exact_id, _ = record(exact_path, **MAIN, page_map_every=1)
    timeline = reader.steps(recorded.run_id)
    replayed_steps = offloaded = 0
    for index, step in enumerate(timeline.steps):
        view = reader.view(recorded.run_id, timeline.t_s[index])
        truth = queries.page_map_at(exact_path, exact_id, step)
        if view.pages is None:
            continue
        assert view.page_map is not None and truth is not None and truth.step == step
        shown, exact = view.pages, truth.owners
        gone = np.isin(shown, [PAGE_FREE, PAGE_EVICTED, PAGE_OFFLOADED])
        exact_gone = np.isin(exact, [PAGE_FREE, PAGE_EVICTED])
        # Who holds each page is exact; a free page may still read "evicted" for the
        # few steps until the next snapshot.
        assert np.array_equal(gone, exact_gone), step
        assert np.array_equal(shown[~gone], exact[~exact_gone]), step
        assert np.isin(shown[exact == PAGE_EVICTED], [PAGE_EVICTED, PAGE_OFFLOADED]).all(), step
        replayed_steps += view.page_map.step != step
        offloaded += int(np.count_nonzero(shown == PAGE_OFFLOADED))
    assert replayed_steps > len(timeline) // 2 and offloaded > 0


def test_requests_mid_run_hold_the_pages_the_map_shows(
    recorded: Recorded, reader: RunReader
) -> None:
    timeline = reader.steps(recorded.run_id)
    view = reader.view(recorded.run_id, timeline.t_s[len(timeline) // 2])
    assert view.pages is not None
    running = [r for r in view.requests if r.state == "running"]
    assert running
    final = {r.request_id: r for r in queries.requests_table(reader.conn, recorded.run_id)}
    for r in view.requests:
        assert r.pages == int(np.count_nonzero(view.pages == r.request_id))
        if r.state == "running" and r.ttft_s is not None:
            # Progress so far: at least its first token, at most what it ends with.
            assert 1 <= r.output_tokens <= final[r.request_id].output_tokens
            assert (r.tpot_s is None) == (r.output_tokens == 1)
        elif r.state == "waiting":
            assert r.output_tokens is None and r.tpot_s is None
    assert {r.request_id for r in running} <= set(view.pages[view.pages >= 0].tolist())
    assert view.row is not None and view.row.running == len(running)


def test_preempted_requests_read_preempted_until_resumed(
    recorded: Recorded, reader: RunReader
) -> None:
    conn = reader.conn
    step, rid = conn.execute(
        "SELECT step, request_id FROM events WHERE run_id = ? AND kind = 'request_preempted'"
        " ORDER BY step, ts_ns LIMIT 1",
        (recorded.run_id,),
    ).fetchone()
    timeline = reader.steps(recorded.run_id)
    view = reader.view(recorded.run_id, timeline.t_s[timeline.steps.index(step)])
    preempted = next(r for r in view.requests if r.request_id == rid)
    assert preempted.state == "preempted" and preempted.preemptions == 1  # counted up to the step
    resumed = conn.execute(
        "SELECT MIN(step) FROM events WHERE run_id = ? AND kind = 'request_resumed' AND request_id = ? AND step > ?",
        (recorded.run_id, rid, step),
    ).fetchone()[0]
    later = reader.view(recorded.run_id, timeline.t_s[timeline.steps.index(resumed)])
    assert next(r for r in later.requests if r.request_id == rid).state in ("running", "finished")


def test_progress_at_the_finish_step_equals_the_recorded_figures(
    recorded: Recorded, reader: RunReader
) -> None:
    """Output tokens and TPOT derived from events while a request runs: at the step
    it finished they must equal what the engine recorded, preempted requests too."""
    conn = reader.conn
    finished = conn.execute(
        """SELECT e.request_id, e.step, e.ts_ns, r.output_tokens, r.tpot_s, r.preemptions
           FROM events e JOIN requests r ON r.run_id = e.run_id AND r.request_id = e.request_id
           WHERE e.run_id = ? AND e.kind = 'request_finished'""",
        (recorded.run_id,),
    ).fetchall()
    assert sum(1 for *_, preemptions in finished if preemptions) >= 3
    for rid, step, ts_ns, output, tpot, _ in finished:
        (progress,) = request_progress(conn, Position(recorded.run_id, step, ts_ns), [rid]).values()
        assert progress.output_tokens == output, rid
        assert progress.tpot_s == pytest.approx(tpot, rel=1e-9), rid


def test_step_times_read_only_new_steps(tmp_path) -> None:
    from kvscope.profiler.synthetic import SyntheticRun

    from support.tui_helpers import make_recorder

    recorder = make_recorder(tmp_path / "live.db")
    events = SyntheticRun(recorder.start_ns, num_requests=6, num_pages=32).events
    half = len(events) // 2
    for event in events[:half]:
        recorder.on_event(event)
    recorder.flush()
    reader = RunReader(tmp_path / "live.db")
    assert reader.ready()
    first = reader.steps(recorder.run_id)
    for event in events[half:]:
        recorder.on_event(event)
    recorder.finish("complete")
    second = reader.steps(recorder.run_id)
    assert second.steps[: len(first)] == first.steps and len(second) > len(first)
    assert list(second.steps) == list(range(len(second)))


def test_check_database_explains_every_unusable_path(tmp_path, recorded: Recorded) -> None:
    cases = {
        "missing": (tmp_path / "missing.db", "no database at"),
        "directory": (tmp_path, "is a directory"),
        "empty": (tmp_path / "empty.db", "is empty: not a kvscope database"),
        "foreign": (tmp_path / "foreign.db", "another application"),
        "not sqlite": (tmp_path / "text.db", "cannot use"),
    }
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "text.db").write_text("hello, not a database\n" * 200)
    with sqlite3.connect(tmp_path / "foreign.db") as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    for path, words in cases.values():
        with pytest.raises(KvscopeError, match=words):
            check_database(path, None)
    with pytest.raises(KvscopeError, match=r"no run 99 in .* \(it holds runs 1, 2\)"):
        check_database(recorded.path, 99)
    check_database(recorded.path, recorded.run_id)
    # A run about to be recorded: the file and run may not exist yet.
    check_database(tmp_path / "missing.db", None, missing_ok=True)
    check_database(tmp_path / "empty.db", 1, missing_ok=True)


def test_check_database_waits_for_a_first_run_only_when_following(tmp_path) -> None:
    from kvscope.db.store import open_db

    open_db(tmp_path / "new.db").conn.close()
    with pytest.raises(KvscopeError, match="holds no runs yet"):
        check_database(tmp_path / "new.db", None)
    check_database(tmp_path / "new.db", None, no_runs_ok=True)
    run_id, _ = record(tmp_path / "new.db", **{**MAIN, "num_requests": 3})
    check_database(tmp_path / "new.db", run_id)
