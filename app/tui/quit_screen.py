"""Quitting while a run records (``q`` or Ctrl+C in a live ``kvscope run``): ask first.

Quitting used to stop the run at once. Now the user chooses: stop it (its run
is marked interrupted), detach (the UI closes and the run finishes headless in
the same process, then prints its summary), or keep watching.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

STOP = "stop"
DETACH = "detach"


class QuitScreen(ModalScreen[str | None]):
    """Dismisses with STOP, DETACH or None (keep watching)."""

    DEFAULT_CSS = """
    QuitScreen { align: center middle; background: #1c1f26 70%; }
    #quit { width: 64; height: auto; border: round #e15759; padding: 0 1; background: #232833; }
    """

    BINDINGS = [
        Binding("s,q,ctrl+c", "choose('stop')", "Stop the run"),
        Binding("d", "choose('detach')", "Detach"),
        Binding("escape,k", "choose(None)", "Keep watching"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="quit"):
            yield Static(
                "The run is still recording.\n\n"
                "[b]s[/b] / q  stop it now (the run is marked interrupted)\n"
                "[b]d[/b]      detach: close the UI, the run finishes headless\n"
                "[b]Esc[/b]    keep watching"
            )

    def on_mount(self) -> None:
        self.query_one("#quit").border_title = "Quit kvscope?"

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
