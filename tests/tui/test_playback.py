"""Playback rules and the CPU budget, without a terminal."""

from __future__ import annotations

import pytest

from kvscope.app.tui.cpu_budget import MAX_BURST_S, CpuBudget
from kvscope.app.tui.playback import SPEEDS, Playback, default_speed
from kvscope.db.series import StepTimes

STEPS = StepTimes((0, 1, 2, 5), (0.0, 1.0, 2.0, 5.0))


def test_seeking_pauses_and_stays_within_the_run() -> None:
    p = Playback(follow=True)
    assert p.mode(live=True) == "live" and p.wanted_s() is None
    p.seek(9.0, STEPS.end_s)
    assert (p.follow, p.playing, p.position_s, p.wanted_s()) == (False, False, 5.0, 5.0)
    p.seek(-1.0, STEPS.end_s)
    assert p.position_s == 0.0 and p.mode(live=True) == "paused"


def test_a_replay_stops_at_the_end_of_a_finished_run_and_goes_live_on_a_running_one() -> None:
    p = Playback(follow=False)
    p.speed = 2.0
    p.toggle(shown_s=0.0, end_s=5.0, live=False)
    assert p.playing and p.mode(live=False) == "playing"
    p.advance(1.0, end_s=5.0, live=False)
    assert p.position_s == 2.0
    p.advance(10.0, end_s=5.0, live=False)
    assert (p.playing, p.position_s, p.follow) == (False, 5.0, False)
    p.toggle(shown_s=5.0, end_s=5.0, live=False)  # at the end: plays again from the start
    assert p.playing and p.position_s == 0.0
    p.advance(10.0, end_s=5.0, live=True)
    assert p.follow and not p.playing


def test_pausing_a_live_view_stays_at_the_shown_step() -> None:
    p = Playback(follow=True)
    p.toggle(shown_s=3.5, end_s=5.0, live=True)
    assert (p.follow, p.playing, p.position_s) == (False, False, 3.5)
    p.seek_end(end_s=5.0, live=True)
    assert p.follow
    p.seek_end(end_s=5.0, live=False)
    assert not p.follow and p.position_s == 5.0


def test_stepping_moves_between_recorded_steps() -> None:
    p = Playback(follow=False)
    p.seek(1.5, STEPS.end_s)  # shows step 1
    p.step(STEPS, 1, shown_s=1.0)
    assert p.position_s == 2.0
    p.step(STEPS, 5, shown_s=2.0)
    assert p.position_s == 5.0
    p.step(STEPS, -9, shown_s=5.0)
    assert p.position_s == 0.0
    assert STEPS.index_of_step(4) == 2 and STEPS.index_of_step(-1) == 0


def test_speeds_step_through_the_list_and_stop_at_its_ends() -> None:
    p = Playback()
    p.speed = SPEEDS[-1]
    p.change_speed(1)
    assert p.speed == SPEEDS[-1]
    p.change_speed(-2)
    assert p.speed == SPEEDS[-3]
    assert default_speed(30.0) == 1.0 and default_speed(300.0) == 10.0


def test_cpu_budget_refills_with_time_and_caps_a_burst() -> None:
    budget = CpuBudget()
    assert budget.tick(100.0, None) and budget.left_s == 0.0  # nothing charged
    budget.tick(100.0, 0.25)
    assert budget.left_s == pytest.approx(MAX_BURST_S)
    budget.charge_read(1.0)  # a read that took a CPU second overdraws it
    assert not budget.tick(0.0, 0.25) and budget.left_s < -0.9
    budget.restart()
    assert budget.left_s == 0.0 and budget.tick(1.0, 0.25)  # refilled again
