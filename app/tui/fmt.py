"""Number formatting and text sparklines shared by every panel.

One place decides how a missing figure reads ("—"), so no panel prints
"None" or "nan", and every panel rounds the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

MISSING = "—"
_BARS = "▁▂▃▄▅▆▇█"


def pct(value: float | None, digits: int = 1) -> str:
    """A fraction shown as a percentage."""
    return MISSING if value is None else f"{value * 100:.{digits}f}%"


def count(value: float | None) -> str:
    """An integer with thousands separators."""
    return MISSING if value is None else f"{round(value):,}"


def rate(value: float | None, unit: str = "/s") -> str:
    """A per-second rate, compact (k, M) so columns stay narrow."""
    if value is None:
        return MISSING
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{suffix}{unit}"
    return f"{value:.1f}{unit}"


def seconds(value: float | None) -> str:
    """A duration in the unit that keeps it readable (µs, ms, s)."""
    if value is None:
        return MISSING
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1.0:
        return f"{value * 1e3:.1f} ms"
    if value < 120.0:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def gib(value: float | None) -> str:
    """Bytes as GiB (GPU memory figures)."""
    return MISSING if value is None else f"{value / 2**30:.1f} GiB"


def size(value: float | None) -> str:
    """Bytes, compact in binary units (80.6K, 414M, 19.7G)."""
    if value is None:
        return MISSING
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}B"


def number(value: float | None, digits: int = 2) -> str:
    """A plain float (TFLOP/s, GB/s, watts)."""
    return MISSING if value is None else f"{value:.{digits}f}"


def peak(value: float | None) -> str:
    """A device's peak, with the digits it was given (0.85 TFLOP/s, 3350 GB/s)."""
    return MISSING if value is None else f"{value:g}"


def spark(values: Sequence[float | None], width: int, top: float | None = None) -> str:
    """The last ``width`` values as a one-line bar chart (a missing value is a blank).

    ``top`` fixes the scale (1.0 for fractions) so bars of different runs compare;
    without it the largest value fills the cell.
    """
    values = list(values)[-width:] if width > 0 else []
    known = [v for v in values if v is not None]
    scale = (top if top is not None else max(known, default=0.0)) or 1.0
    cells = []
    for value in values:
        if value is None:
            cells.append(" ")
        else:
            level = round(min(max(value / scale, 0.0), 1.0) * (len(_BARS) - 1))
            cells.append(_BARS[level])
    return "".join(cells)
