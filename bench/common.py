"""Shared set-up for the benchmark scripts: thread policy, model, tables.

The scripts import the installed ``kvscope`` (``make install``), never the checkout's
folders: run them with ``.venv/bin/python bench/<name>.py`` from anywhere.
"""

from __future__ import annotations

import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table (it reads fine in a terminal and pastes into the README)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def median(values: list[float]) -> float:
    return statistics.median(values)
