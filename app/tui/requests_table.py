"""The requests panel: one row per request at the current position, sortable.

Rows are rebuilt only when the requests changed, in the chosen order (the
table's own sort would compare formatted text), the first MAX_ROWS of them; the cursor stays on the same
request across rebuilds (unless it is on the top row, which it keeps). Enter or
a click selects a request, which the page map then highlights.

The table never scrolls sideways: its columns are one character apart (a sorted
figure's arrow takes that place), and where the panel is too narrow for all of them
the least useful give way (``Column.keep``), named in the border's subtitle.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from kvscope.app.tui import fmt
from kvscope.app.tui.palette import owner_colour
from kvscope.db.requests import RequestState


@dataclass(frozen=True, slots=True)
class Column:
    key: str  # RequestState field the column shows and sorts by ("misses.x": a field of it)
    label: str
    width: int  # of its widest figure; one more on screen, for the gap before it
    keep: int  # the narrower the panel, the fewer columns: those with the highest keep stay
    right: bool = True  # right-aligned, the gap on its left (else left-aligned, gap after)


def field_value(r: RequestState, key: str):
    """The figure a column shows: a field of the request, or of its miss split (None
    when the request recorded none)."""
    head, _, rest = key.partition(".")
    value = getattr(r, head)
    return getattr(value, rest) if rest and value is not None else value


COLUMNS = (
    Column("request_id", "id", 5, 13, right=False),
    Column("state", "state", 9, 12, right=False),
    Column("prompt_tokens", "prompt", 6, 11),
    Column("output_tokens", "out", 5, 5),
    Column("cached_tokens", "cached", 6, 6),
    Column("pages", "pages", 5, 10),  # held, shared ones included (the split: last columns)
    Column("ttft_s", "TTFT", 7, 7),
    Column("tpot_s", "TPOT", 7, 3),
    Column("preemptions", "pre", 3, 2),
    # Why its prompt tokens missed the prefix cache: the main reason, and the tokens that
    # more KV memory would have saved (engine/miss_reasons.py).
    Column("misses.main", "missed", 11, 9),
    Column("misses.capacity", "cap", 5, 1),
    Column("shared_pages", "shr pg", 6, 8),  # of its pages, those held with other requests
    Column("would_free", "frees", 5, 4),  # pages back to the free list if it finished now
)


def fitting(width: int) -> tuple[int, ...]:
    """Indices of the columns shown in ``width`` cells, in table order: the most useful
    (highest ``keep``) that fit, each taking its width and a gap."""
    shown: list[int] = []
    used = 0
    for i in sorted(range(len(COLUMNS)), key=lambda i: -COLUMNS[i].keep):
        if used + COLUMNS[i].width + 1 <= width:
            shown.append(i)
            used += COLUMNS[i].width + 1
    return tuple(sorted(shown))


# Rows shown at most (the first in the chosen order): refilling a table costs
# time per row, and the UI must stay light however long the run.
MAX_ROWS = 100

# Sort order of states: requests that hold the cache now come first.
STATE_RANK = {"running": 0, "preempted": 1, "waiting": 2, "finished": 3, "rejected": 4}

STATE_STYLES = {
    "running": "bold #59a14f",
    "waiting": "#edc948",
    "preempted": "bold #e15759",
    "finished": "#8c9bb0",
    "rejected": "#e15759",
}


def row_cells(r: RequestState) -> tuple[Text, ...]:
    """The cells of one request's row (the id in the request's page-map colour)."""

    def right(value: str) -> Text:
        return Text(value, justify="right")

    def seconds(value: float | None) -> Text:
        return right(fmt.seconds(value).replace(" ", ""))  # "12.3ms": narrower

    return (
        Text.assemble(("■ ", owner_colour(r.request_id)), str(r.request_id)),
        Text(r.state, style=STATE_STYLES[r.state]),
        right(fmt.count(r.prompt_tokens)),
        right(fmt.count(r.output_tokens)),
        right(fmt.count(r.cached_tokens)),
        right(fmt.count(r.pages)),
        seconds(r.ttft_s),
        seconds(r.tpot_s),
        right(str(r.preemptions)),
        right(field_value(r, "misses.main") or fmt.MISSING),
        right(fmt.count(field_value(r, "misses.capacity"))),
        right(fmt.count(r.shared_pages)),
        right(fmt.count(r.would_free)),
    )


class RequestsTable(DataTable):
    """Requests at the position; ``sort_column`` and ``sort_reverse`` order them."""

    requests: reactive[tuple[RequestState, ...]] = reactive((), always_update=False)
    """The rows shown: replaced only when a request changed, so the table is not rebuilt needlessly."""

    sort_column: reactive[int] = reactive(1)
    """Index into COLUMNS of the column the rows are ordered by (first: state, so
    running requests lead); ties keep request-id order."""

    sort_reverse: reactive[bool] = reactive(False)
    """Descending order (most pages, slowest TTFT first)."""

    visible: reactive[tuple[int, ...]] = reactive(tuple(range(len(COLUMNS))))
    """Indices into COLUMNS of the columns shown: those that fit the panel's width."""

    def __init__(self, **kw) -> None:
        # No cell padding: each column carries its own one-character gap (``Column.right``).
        super().__init__(cursor_type="row", zebra_stripes=True, cell_padding=0, **kw)
        self._shown: list[RequestState] = []  # the rows on screen, in order

    def on_mount(self) -> None:
        self._add_columns()

    def on_resize(self) -> None:
        self.visible = fitting(self.scrollable_content_region.width)

    def watch_visible(self) -> None:
        if not self.is_mounted:
            return
        self.clear(columns=True)
        self._shown = []
        self._add_columns()
        self._rebuild()

    def _add_columns(self) -> None:
        for i in self.visible:
            column = COLUMNS[i]
            self.add_column(column.label, width=column.width + 1, key=column.key)
        hidden = [COLUMNS[i].label for i in range(len(COLUMNS)) if i not in self.visible]
        self.border_subtitle = f"wider for {', '.join(hidden)}" if hidden else ""
        self._relabel()

    def watch_requests(self) -> None:
        self._rebuild()

    def watch_sort_column(self) -> None:
        self._relabel()
        self._rebuild()

    def watch_sort_reverse(self) -> None:
        self._relabel()
        self._rebuild()

    def sort_by(self, index: int) -> None:
        """Order by column ``index``; asking again for the same column flips the order."""
        if index == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column = index

    def sort_next(self) -> None:
        """Order by the next column shown (the sort key)."""
        later = [i for i in self.visible if i > self.sort_column]
        self.sort_column = later[0] if later else self.visible[0]

    def ordered(self) -> list[RequestState]:
        """The requests in display order (a missing figure sorts below every number)."""
        key = COLUMNS[self.sort_column].key

        def value(r: RequestState) -> tuple[bool, float]:
            v = STATE_RANK[r.state] if key == "state" else field_value(r, key)
            return (v is not None, v if v is not None else 0)

        by_id = sorted(self.requests, key=lambda r: r.request_id)
        return sorted(by_id, key=value, reverse=self.sort_reverse)

    def _relabel(self) -> None:
        if not self.columns:
            return
        for i in self.visible:
            column = COLUMNS[i]
            arrow = ("▼" if self.sort_reverse else "▲") if i == self.sort_column else ""
            if column.right:  # the arrow takes the gap's place
                label = (arrow or " ") + column.label.rjust(column.width)
            else:
                label = column.label + arrow
            self.columns[column.key].label = Text(label)
        self.refresh()

    def _rebuild(self) -> None:
        """Show ``requests`` in order: cells of changed rows are updated in place when
        the rows and their order are the same (the common case while a run goes on),
        else the table is refilled."""
        if not self.columns:
            return
        ordered = self.ordered()[:MAX_ROWS]
        shown = f"first {MAX_ROWS} of " if len(self.requests) > MAX_ROWS else ""
        self.border_title = f"Requests · {shown}{len(self.requests):,}"
        if [r.request_id for r in ordered] == [r.request_id for r in self._shown]:
            for new, old in zip(ordered, self._shown, strict=True):
                if new != old:
                    cells = row_cells(new)
                    for i in self.visible:
                        self.update_cell(str(new.request_id), COLUMNS[i].key, cells[i])
        else:
            # The cursor follows its request when the user moved it; at the top it stays there.
            cursor = self.cursor_request() if self.cursor_row > 0 else None
            self.clear()
            for r in ordered:
                cells = row_cells(r)
                self.add_row(*(cells[i] for i in self.visible), key=str(r.request_id))
            if cursor is not None and str(cursor) in self.rows:
                self.move_cursor(row=self.get_row_index(str(cursor)), animate=False, scroll=False)
        self._shown = ordered

    def cursor_request(self) -> int | None:
        """The request under the cursor, if any."""
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return int(key.value) if key.value is not None else None

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(self.visible[event.column_index])
