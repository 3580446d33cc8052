"""The names the code uses for what the database holds.

The tables themselves are created by ``db.migrations`` (one function per schema
version); this module lists the current column orders the writer inserts in and
the run-status vocabulary, so both sides agree on one spelling.
"""

from __future__ import annotations

# PRAGMA application_id marks a file as a kvscope database ("kvsc" in ASCII).
APPLICATION_ID = 0x6B767363

# Run status as stored. INCOMPLETE is never stored: readers derive it from a
# 'running' row whose writer is gone (see db.queries.resolve_status).
RUNNING = "running"
COMPLETE = "complete"
INTERRUPTED = "interrupted"
FAILED = "failed"
INCOMPLETE = "incomplete"
FINAL_STATUSES = (COMPLETE, INTERRUPTED, FAILED)

# Column orders of the typed tables after ``run_id``; the names equal the
# fields of the engine event each row comes from.
STEP_COLUMNS = (
    "step",
    "ts_ns",
    "batch_size",
    "prefill_tokens",
    "decode_tokens",
    "running",
    "waiting",
    "pages_total",
    "pages_used",
    "pages_cached",
    "pages_free",
    "page_size",
    "tokens_held",
    "host_pages_used",
    "duration_s",
)
KERNEL_COLUMNS = ("ts_ns", "step", "name", "shape", "seconds", "flops", "bytes")
GPU_COLUMNS = (
    "ts_ns",
    "step",
    "device",
    "utilization_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_w",
    "sm_clock_mhz",
    "torch_allocated_bytes",
)
PAGE_MAP_COLUMNS = (
    "ts_ns",
    "step",
    "num_pages",
    "pages_owned",
    "pages_cached",
    "pages_free",
    "pages_evicted",
    "owners",
)
