"""The names the code uses for what the database holds.

The tables themselves are created by ``db.migrations`` (one function per schema
version); this module lists the current column orders the writer inserts in and
the run-status vocabulary, so both sides agree on one spelling.
"""

from __future__ import annotations

from dataclasses import fields

from kvscope.engine.events import Event, GpuSample, KernelTiming, StepSummary

# PRAGMA application_id marks a file as a kvscope database ("kvsc" in ASCII).
APPLICATION_ID = 0x6B767363

# Run status as stored. INCOMPLETE is never stored: readers derive it from a
# 'running' row whose writer is gone (see db.runs.resolve_status).
RUNNING = "running"
COMPLETE = "complete"
INTERRUPTED = "interrupted"
FAILED = "failed"
INCOMPLETE = "incomplete"
# A watch that recorded, though some of its sources never connected.
PARTIAL = "partial"
FINAL_STATUSES = (COMPLETE, INTERRUPTED, FAILED, PARTIAL)


# Column orders of the typed tables after ``run_id``: the fields of the engine
# event each row comes from, read off the event class so there is one list.
def _event_columns(cls: type[Event]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


STEP_COLUMNS = ("step", "ts_ns", *_event_columns(StepSummary)[2:])
KERNEL_COLUMNS = _event_columns(KernelTiming)
GPU_COLUMNS = _event_columns(GpuSample)
PAGE_MAP_COLUMNS = (
    "ts_ns",
    "step",
    "num_pages",
    "pages_owned",
    "pages_cached",
    "pages_free",
    "pages_evicted",
    "owners",
    "holds",
    "tree",
)
