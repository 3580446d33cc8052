"""The replay bar: where the shown step sits in the run, and how playback runs.

One line: mode (live, playing at a speed, paused), the position as a bar from
the run's start to its newest step, and the step and time. Clicking the bar
seeks there.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from kvscope.app.tui import fmt


class Timeline(Widget):
    """Position of the shown step within the recorded run."""

    mode: reactive[str] = reactive("waiting")
    """live | playing | paused | waiting: how the position moves."""

    speed: reactive[float] = reactive(1.0)
    """Replay speed (run seconds per wall second)."""

    position_s: reactive[float] = reactive(0.0)
    """Seconds since the run's start of the shown step."""

    end_s: reactive[float] = reactive(0.0)
    """Seconds since the run's start of the newest recorded step."""

    step_label: reactive[str] = reactive("")
    """"step N (i/n)" of the shown step."""

    class Seek(Message):
        """The user clicked the bar at ``fraction`` (0 = start, 1 = newest step)."""

        def __init__(self, fraction: float) -> None:
            super().__init__()
            self.fraction = fraction

    _MODES = {
        "live": ("● LIVE", "bold #59a14f"),
        "playing": ("▶ PLAY", "bold #4e79a7"),
        "paused": ("⏸ PAUSED", "bold #edc948"),
        "waiting": ("… WAITING", "italic #8c9bb0"),
    }

    def _prefix(self) -> Text:
        label, style = self._MODES[self.mode]
        text = Text(f" {label} ", style=style)
        if self.mode == "playing":
            text.append(f"{self.speed:g}× ", style=style)
        return text

    def _suffix(self) -> Text:
        return Text(
            f" {self.step_label} · {fmt.seconds(self.position_s)} / {fmt.seconds(self.end_s)} ",
            style="#c0c8d4",
        )

    def _bar_width(self) -> int:
        return self.size.width - self._prefix().cell_len - self._suffix().cell_len

    def render(self) -> Text:
        prefix, suffix, width = self._prefix(), self._suffix(), self._bar_width()
        text = prefix.copy()
        if width > 2:
            fraction = self.position_s / self.end_s if self.end_s > 0 else 1.0
            at = round(min(max(fraction, 0.0), 1.0) * (width - 1))
            text.append("━" * at, style="#4e79a7")
            text.append("●", style="bold #e5e9f0")
            text.append("─" * (width - 1 - at), style="#3b4252")
        text.append_text(suffix)
        return text

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        width = self._bar_width()
        if offset is None or width <= 2:
            return
        x = offset.x - self._prefix().cell_len
        if 0 <= x < width:
            self.post_message(self.Seek(x / (width - 1)))
