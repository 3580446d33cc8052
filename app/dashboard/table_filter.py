"""The requests table's server-side filter and sort, in DataTable's query syntax.

The browser only ever receives one page of a run with many requests, so the
dashboard filters and sorts the rows from ``db.requests.requests_table`` here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from operator import attrgetter
from typing import Any

from kvscope.db.requests import RequestRow

_FILTER_PART = re.compile(
    r"\{(?P<column>\w+)\}\s*(?P<case>[si])?(?P<op>contains|datestartswith|eq|ne|le|lt|ge|gt|"
    r"<=|>=|!=|=|<|>)\s*(?P<value>.+)"
)
_COMPARE = {
    "eq": lambda a, b: a == b,
    "=": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "!=": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "<": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "<=": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    ">": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    ">=": lambda a, b: a >= b,
}


def _literal(text: str) -> str | float:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"`":
        return text[1:-1]
    try:
        return float(text)
    except ValueError:
        return text


_REQUEST_FIELDS = frozenset(f.name for f in fields(RequestRow))


def _clause(part: str) -> Callable[[RequestRow], bool] | None:
    """One clause of a DataTable filter query as a test of a row, parsed once;
    None for a clause it cannot read (which then filters nothing)."""
    m = _FILTER_PART.fullmatch(part.strip())
    if m is None or m["column"] not in _REQUEST_FIELDS:
        return None
    column, op, wanted = m["column"], m["op"], _literal(m["value"])
    if op in ("contains", "datestartswith"):
        fold = m["case"] == "i"
        needle = str(wanted).lower() if fold else str(wanted)

        def text_test(row: RequestRow) -> bool:
            value = getattr(row, column)
            if value is None:
                return False
            text = str(value).lower() if fold else str(value)
            return text.startswith(needle) if op == "datestartswith" else needle in text

        return text_test
    compare = _COMPARE[op]

    def value_test(row: RequestRow) -> bool:
        value = getattr(row, column)
        if value is None:
            return False
        if isinstance(value, str) != isinstance(wanted, str):
            return compare(str(value), str(wanted))
        return compare(value, wanted)

    return value_test


def filter_requests(
    rows: Sequence[RequestRow], filter_query: str = "", sort_by: Sequence[dict] = ()
) -> list[RequestRow]:
    """The requests table filtered and sorted server-side with DataTable's query
    syntax (the browser only ever receives one page of a run with many requests)."""
    tests = [t for part in (filter_query or "").split(" && ") if (t := _clause(part))]
    kept = [row for row in rows if all(test(row) for test in tests)]
    for key in reversed(sort_by or ()):
        column = key["column_id"]
        if column not in _REQUEST_FIELDS:
            continue
        present = [row for row in kept if getattr(row, column) is not None]
        missing = [row for row in kept if getattr(row, column) is None]
        present.sort(key=attrgetter(column), reverse=key["direction"] == "desc")
        kept = present + missing
    return kept


def request_record(row: RequestRow) -> dict[str, Any]:
    """One DataTable record (``id`` is the row id DataTable selects by)."""
    return asdict(row) | {"id": row.request_id}
