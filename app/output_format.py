"""How commands print figures: aligned text tables, binary units, JSON-friendly numbers."""

from __future__ import annotations

from typing import Any

GIB = 1 << 30
NUMERIC_WORDS = ("never", "n/a")  # stand in for a number: aligned with the numbers


def format_table(rows: list[list[str]], header: list[str] | None = None) -> str:
    """Columns padded to a common width; columns of numbers are right-aligned."""
    lines = [header, *rows] if header else rows
    columns = list(zip(*lines, strict=True))
    widths = [max(map(len, column)) for column in columns]
    numeric = [
        i > 0
        and all(
            c[:1].isdigit() or c[:1] == "-" or c in NUMERIC_WORDS
            for c in column[bool(header) :]
            if c
        )
        for i, column in enumerate(columns)
    ]
    return "\n".join(
        "  ".join(
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(line, widths, numeric, strict=True)
        ).rstrip()
        for line in lines
    )


def human_bytes(n: float) -> str:
    """Binary units: 131072 -> '128 KiB', 201326592 -> '192 MiB'."""
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n:,.0f} B"


def count_text(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


def plain(value: float) -> int | float:
    """Integral floats as ints, so JSON says 131072, not 131072.0."""
    return int(value) if float(value).is_integer() else value


def plain_dict(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: plain(v) if isinstance(v, float) else v for k, v in figures.items()}
