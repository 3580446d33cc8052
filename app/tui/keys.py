"""Every key binding of the TUI, written once: the app binds them, the footer shows
the main ones and the help screen lists them all."""

from __future__ import annotations

from textual.binding import Binding

# Replay keys take priority so they work whichever panel has focus.
BINDINGS = (
    Binding("space", "toggle_play", "Play/pause", key_display="␣", priority=True),
    Binding("left", "step(-1)", "Step back", key_display="←", priority=True),
    Binding("right", "step(1)", "Step", key_display="→", priority=True),
    Binding("pageup", "jump(-0.1)", "Back 10%", key_display="PgUp", show=False, priority=True),
    Binding("pagedown", "jump(0.1)", "Forward 10%", key_display="PgDn", show=False, priority=True),
    Binding("home", "seek_start", "Start", key_display="Home", show=False, priority=True),
    Binding("end", "seek_end", "Live / end", key_display="End", show=False, priority=True),
    Binding("minus", "speed(-1)", "Slower", key_display="-", show=False),
    Binding("plus,equals_sign", "speed(1)", "Faster", key_display="+", show=False),
    Binding("s", "sort", "Sort requests by the next column", show=False),
    Binding("escape", "unselect", "Unselect request", key_display="Esc", show=False),
    Binding("r", "switch_run", "Runs"),
    Binding("question_mark", "help", "Help", key_display="?"),
    Binding("q", "quit", "Quit"),
)

# Help-screen lines for what is done with the mouse or inside a panel.
OTHER_KEYS = (
    ("↑ ↓  Enter", "move in the requests table; Enter selects a request"),
    ("click a page", "select the request holding it"),
    ("click a header", "sort the requests by that column (again: reverse)"),
    ("click the bar", "seek to that point of the run"),
    ("Tab", "focus the requests table or the panel area (↑ ↓ then scroll it)"),
    ("mouse wheel", "scroll the panels (small terminals) or the requests"),
    ("Ctrl+Q / Ctrl+C", "quit"),
)
