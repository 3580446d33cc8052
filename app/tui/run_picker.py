"""The run picker (``r``): every run in the database, to switch the view to one."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from kvscope.app.tui import fmt
from kvscope.db.queries import RunInfo

STATUS_STYLES = {
    "running": "bold #59a14f",
    "complete": "#8c9bb0",
    "interrupted": "#edc948",
    "partial": "#edc948",
    "failed": "#e15759",
    "incomplete": "#e15759",
}


def run_label(run: RunInfo, current: int | None) -> Text:
    """One line per run: id, status, kind, model, size."""
    text = Text("▸ " if run.run_id == current else "  ", style="bold #edc948")
    text.append(f"run {run.run_id:<4}", style="bold")
    text.append(f"{run.status:<12}", style=STATUS_STYLES.get(run.status, ""))
    text.append(f"{run.kind:<10}")
    text.append(f"{fmt.count(run.requests):>6} req {fmt.count(run.steps):>8} steps  ")
    text.append(run.subject or "", style="#8c9bb0")
    return text


class RunPicker(ModalScreen[int | None]):
    """Dismisses with the chosen run id, or None on Esc."""

    BINDINGS = [Binding("escape,q,r", "dismiss(None)", "Close", key_display="Esc")]

    def __init__(self, runs: list[RunInfo], current: int | None) -> None:
        super().__init__()
        self.runs = runs
        self.current = current

    def compose(self) -> ComposeResult:
        yield OptionList(
            *(Option(run_label(run, self.current), id=str(run.run_id)) for run in self.runs),
            id="runs",
        )

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.border_title = "Runs (Enter to show, Esc to close)"
        ids = [run.run_id for run in self.runs]
        if self.current in ids:
            options.highlighted = ids.index(self.current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))
