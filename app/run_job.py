"""Drive a workload through the engine in real time: requests join at their arrival times.

The same driver runs headless (main thread, a progress line) and under the
TUI (a worker thread); ``stop`` ends it early, the way Ctrl-C or quitting the
UI does, and the run is then recorded as interrupted.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from kvscope.app.workloads import WorkItem
from kvscope.engine.engine import Engine
from kvscope.engine.errors import RequestError
from kvscope.engine.sampler import SamplingParams


@dataclass(slots=True)
class RunProgress:
    """Where a driven workload stands: what ``drive`` hands ``on_progress``."""

    submitted: int
    finished: int
    rejected: int
    total: int
    output_tokens: int
    elapsed_s: float
    running: int
    waiting: int


def render_prompt(engine: Engine, item: WorkItem) -> str:
    return engine.codec.render_chat(item.messages()) if item.chat else item.prompt


def drive(
    engine: Engine,
    items: list[WorkItem],
    stop: threading.Event,
    on_progress: Callable[[RunProgress], None] | None = None,
    progress_every_s: float = 0.5,
    ignore_eos: bool = False,
) -> dict:
    """Run ``items`` to completion (or until ``stop``); returns counts for the summary.

    ``ignore_eos``: every request runs to its max tokens, so what the run schedules
    does not hang on where the model's text happens to stop, which a CPU's matmul
    kernels can move (the same 24 requests preempted 8 times on one machine, 10 on
    another, through three requests ending a few tokens apart)."""

    pending = deque(sorted(items, key=lambda it: it.arrival_s))
    total = len(pending)
    submitted = finished = 0
    rejections: list[str] = []
    t0 = time.monotonic()
    last_report = 0.0
    tokens_at_start = engine.total_output_tokens
    while (pending or engine.has_unfinished()) and not stop.is_set():
        now = time.monotonic() - t0
        while pending and pending[0].arrival_s <= now:
            item = pending.popleft()
            submitted += 1
            try:
                engine.add_request(
                    render_prompt(engine, item),
                    SamplingParams(max_tokens=item.max_tokens, ignore_eos=ignore_eos),
                )
            except RequestError as exc:
                rejections.append(str(exc))  # refused and recorded as such; the others keep running
        if engine.has_unfinished():
            finished += sum(1 for out in engine.step() if out.finished)
        elif pending:
            stop.wait(min(pending[0].arrival_s - now, 0.25))
        if on_progress and (time.monotonic() - t0 - last_report >= progress_every_s):
            last_report = time.monotonic() - t0
            on_progress(
                RunProgress(
                    submitted,
                    finished,
                    len(rejections),
                    total,
                    engine.total_output_tokens - tokens_at_start,
                    last_report,
                    len(engine.scheduler.running),
                    len(engine.scheduler.waiting),
                )
            )
    return {
        "submitted": submitted,
        "finished": finished,
        "rejected": len(rejections),
        "rejections": rejections,
        "interrupted": stop.is_set() and (bool(pending) or engine.has_unfinished()),
        "elapsed_s": time.monotonic() - t0,
    }


def group_reasons(reasons: list[str]) -> list[tuple[int, str]]:
    """Rejection reasons counted, most frequent first, one line per distinct reason.

    Messages that differ only in their numbers (``prompt of 931 tokens ...``,
    ``prompt of 968 tokens ...``) are one reason; a number that differs shows
    its range (``prompt of 931-968 tokens ...``).
    """
    groups: dict[str, list[list[int]]] = {}
    for reason in reasons:
        numbers = [int(n) for n in re.findall(r"\d+", reason)]
        groups.setdefault(re.sub(r"\d+", "\0", reason), []).append(numbers)
    counted = Counter({shape: len(found) for shape, found in groups.items()})
    lines = []
    for shape, count in counted.most_common():
        spans = [
            str(low) if low == high else f"{low}-{high}"
            for low, high in ((min(c), max(c)) for c in zip(*groups[shape], strict=True))
        ]
        pieces = shape.split("\0")
        text = "".join(p + s for p, s in zip(pieces, [*spans, ""], strict=True))
        lines.append((count, text))
    return lines
