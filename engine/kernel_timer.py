"""Kernel timings without stalling the GPU: CUDA events now, elapsed times later.

On CUDA, each ``span()`` records a start/end event pair around some work and
``submit()`` queues the spans since the last submit as one kernel entry (say,
one attention call per layer, reported once per step) with its name, shape,
FLOPs and bytes; nothing waits. ``drain()``, called at a step boundary,
reports every entry whose last end event ``query()`` says has completed and
keeps the rest for the next boundary, so the hot path never calls
``synchronize``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

# (step, kernel name, shape, seconds, FLOPs, bytes)
KernelSink = Callable[[int, str, str, float, float, float], None]


class KernelTimer:
    def __init__(self, sink: KernelSink, new_event: Callable[[], Any] | None = None) -> None:
        self.sink = sink
        self._new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._spans: list[tuple[Any, Any]] = []
        self._pending: deque[tuple[list[tuple[Any, Any]], int, str, str, float, float]] = deque()

    @contextmanager
    def span(self) -> Iterator[None]:
        """Record the enclosed CUDA work (on the current stream) into the next ``submit``."""
        start, end = self._new_event(), self._new_event()
        start.record()
        yield
        end.record()
        self._spans.append((start, end))

    def submit(self, step: int, name: str, shape: str, flops: float, nbytes: float) -> None:
        """Queue the spans recorded since the last submit as one kernel timing of ``step``."""
        if self._spans:
            self._pending.append((self._spans, step, name, shape, flops, nbytes))
            self._spans = []

    @property
    def pending(self) -> int:
        return len(self._pending)

    def drain(self, wait: bool = False) -> int:
        """Report finished entries, oldest first (all of them when ``wait``); returns the count."""
        done = 0
        while self._pending:
            spans, step, name, shape, flops, nbytes = self._pending[0]
            if wait:
                spans[-1][1].synchronize()
            elif not spans[-1][1].query():
                break  # later entries end later on the same stream
            self._pending.popleft()
            seconds = sum(start.elapsed_time(end) for start, end in spans) / 1e3
            self.sink(step, name, shape, seconds, flops, nbytes)
            done += 1
        return done
