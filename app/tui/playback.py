"""Where the TUI's shown position is and how it moves: plain state, no Textual.

The position either follows the newest recorded step (live) or sits at a time
in the run (replay), paused or playing at a speed. Keys, clicks and the
refresh timer call these methods; the app only draws the result, so the rules
(seeking pauses, a replay that catches up with a live run goes live, a
finished replay plays again from the start) are tested without a terminal.
"""

from __future__ import annotations

import math

from kvscope.db.series import StepTimes

# Replay speeds (run seconds per wall second); a replay starts at the one that
# plays the whole run in about REPLAY_TARGET_S.
SPEEDS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
REPLAY_TARGET_S = 30.0


def default_speed(duration_s: float) -> float:
    """The replay speed nearest (in ratio) to playing ``duration_s`` in REPLAY_TARGET_S."""
    wanted = max(duration_s, 1e-6) / REPLAY_TARGET_S
    return min(SPEEDS, key=lambda s: abs(math.log(s / wanted)))


class Playback:
    """The position in a run and how it moves.

    ``end_s`` is the time of the newest recorded step, ``live`` whether the run
    is still being written, and ``shown_s`` the time of the step on screen: the
    caller passes them in, so this class never reads anything.
    """

    def __init__(self, follow: bool = True) -> None:
        self.follow = follow  # the position tracks the newest recorded step
        self.playing = False  # a replay advances by ``speed`` run-seconds per wall second
        self.speed = 1.0
        self.position_s: float | None = None  # while not following; None: the newest step

    def mode(self, live: bool) -> str:
        """live | playing | paused: how the position moves, for the replay bar."""
        if self.follow and live:
            return "live"
        return "playing" if self.playing else "paused"

    def wanted_s(self) -> float | None:
        """The time to read (None: the newest step)."""
        return None if self.follow else self.position_s

    def current_s(self, shown_s: float) -> float:
        return shown_s if self.follow or self.position_s is None else self.position_s

    def reset(self, follow: bool) -> None:
        """Another run: follow it (live) or show its end, not playing."""
        self.follow, self.playing, self.position_s = follow, False, None

    def seek(self, t_s: float, end_s: float) -> None:
        """Stay at ``t_s`` (within the run): pauses playback and following."""
        self.follow = self.playing = False
        self.position_s = min(max(t_s, 0.0), end_s)

    def advance(self, wall_s: float, end_s: float, live: bool) -> None:
        """Playback: move ``wall_s * speed`` run-seconds on."""
        position = (self.position_s or 0.0) + wall_s * self.speed
        if position < end_s:
            self.position_s = position
        elif live:
            self.playing = False
            self.follow = True  # caught up with a run still being written: go live
        else:
            self.playing = False
            self.position_s = end_s

    def toggle(self, shown_s: float, end_s: float, live: bool) -> None:
        """Play or pause; pausing a live view stays where it is."""
        if self.playing:
            self.playing = False
        elif self.follow:
            self.seek(self.current_s(shown_s), end_s)
        else:
            if not live and self.current_s(shown_s) >= end_s:
                self.position_s = 0.0  # a finished replay plays again from the start
            self.playing = True

    def step(self, steps: StepTimes, delta: int, shown_s: float) -> None:
        """``delta`` recorded steps on (or back) from the shown one."""
        index = steps.index_at(self.current_s(shown_s)) + delta
        self.seek(steps.t_s[min(max(index, 0), len(steps) - 1)], steps.end_s)

    def seek_end(self, end_s: float, live: bool) -> None:
        """The newest step: following it when the run is live."""
        if live:
            self.follow, self.playing = True, False
        else:
            self.seek(end_s, end_s)

    def change_speed(self, delta: int) -> None:
        index = min(range(len(SPEEDS)), key=lambda i: abs(SPEEDS[i] - self.speed))
        self.speed = SPEEDS[min(max(index + delta, 0), len(SPEEDS) - 1)]
