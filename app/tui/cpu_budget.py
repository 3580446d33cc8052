"""The TUI's CPU budget: a share of one core, refilled with time.

Reading the database and drawing spend from it; the app refreshes only while
it is not overdrawn, so a large run makes the UI refresh less often instead of
taking a core from the engine (on a 2-core machine a busy UI thread slows
torch's GEMMs several-fold).
"""

from __future__ import annotations

import time

# Share of one core the UI may use while an engine runs (a live run, in this
# process or another), and while replaying a finished run; and the most CPU
# seconds it may save up for a burst (keys, a new view).
LIVE_DUTY = 0.03
REPLAY_DUTY = 0.25
MAX_BURST_S = 0.05


class CpuBudget:
    """CPU seconds of the UI thread and of its reads, against ``duty`` x wall time."""

    def __init__(self) -> None:
        self.left_s = 0.0  # CPU seconds the UI may still spend
        self._reads_s = 0.0  # CPU the reads have used in the worker thread
        self._spent_s = time.thread_time()  # CPU of the UI thread and reads so far

    def charge_read(self, cpu_s: float) -> None:
        """A read in a worker thread took ``cpu_s`` (thread_time there)."""
        self._reads_s += cpu_s

    def tick(self, wall_s: float, duty: float | None) -> bool:
        """``wall_s`` passed: refill at ``duty`` (None: nothing is charged, e.g.
        while starting up) and take what was spent; True if a refresh may run."""
        spent = time.thread_time() + self._reads_s
        if duty is not None:
            self.left_s = min(self.left_s + wall_s * duty - (spent - self._spent_s), MAX_BURST_S)
        self._spent_s = spent
        return self.left_s >= 0

    def restart(self) -> None:
        """Charge from now on with an empty budget (building a screen is not a refresh)."""
        self._spent_s = time.thread_time() + self._reads_s
        self.left_s = 0.0
