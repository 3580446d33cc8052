"""The read API in one import: every query and derived figure the front ends use.

The functions live in modules named after what they read (``db.runs``,
``db.series``, ``db.pages``, ``db.events``, ``db.requests``, ``db.kernels``,
``db.raw``); this module gathers the public ones for callers that want the
whole API, such as the profiler's consistency checks and ``kvscope runs``.
Each function takes a source (see ``db.source``) and a run id and returns
small frozen dataclasses; times are seconds since the run's start (``t_s``).
Figures are computed with ``db.formulas``, the same functions the live
metrics use. Queries are safe to run while a writer writes (WAL mode).
"""

from __future__ import annotations

from kvscope.db.events import (
    CHURN_KINDS,
    TIMELINE_KINDS,
    Counters,
    EventCounts,
    TimelineEvent,
    event_counts,
    event_timeline,
)
from kvscope.db.formulas import KernelStat, RunSummary
from kvscope.db.kernels import DevicePeaks, TransferCost, device_peaks, kernel_stats, transfer_costs
from kvscope.db.page_replay import PageStateMatrix, page_state_matrix, step_pages
from kvscope.db.pages import (
    PAGE_OFFLOADED,
    PageBalance,
    PageMatrix,
    PageSnapshot,
    decode_owners,
    page_accounting,
    page_map_at,
    page_maps,
)
from kvscope.db.raw import last_step_ns, raw_rows
from kvscope.db.requests import (
    RequestRow,
    RequestState,
    RequestTimes,
    RequestTrace,
    request_times,
    request_trace,
    requests_table,
)
from kvscope.db.runs import (
    HEARTBEAT_STALE_S,
    Comparison,
    LatestStep,
    RunInfo,
    choose_run,
    compare_runs,
    cost_device,
    fingerprint,
    latest_step,
    list_runs,
    newest_run,
    resolve_status,
    run_info,
    run_summary,
)
from kvscope.db.series import (
    CachedSources,
    GpuPoint,
    StepPoint,
    StepRow,
    StepTimes,
    cached_sources,
    gpu_series,
    step_series,
)
from kvscope.db.source import Source, reader

__all__ = [
    "CHURN_KINDS",
    "HEARTBEAT_STALE_S",
    "PAGE_OFFLOADED",
    "TIMELINE_KINDS",
    "CachedSources",
    "Comparison",
    "Counters",
    "DevicePeaks",
    "EventCounts",
    "GpuPoint",
    "KernelStat",
    "PageBalance",
    "PageMatrix",
    "PageSnapshot",
    "PageStateMatrix",
    "LatestStep",
    "RequestRow",
    "RequestState",
    "RequestTimes",
    "RequestTrace",
    "RunInfo",
    "RunSummary",
    "Source",
    "StepPoint",
    "StepRow",
    "StepTimes",
    "TimelineEvent",
    "TransferCost",
    "cached_sources",
    "choose_run",
    "compare_runs",
    "cost_device",
    "decode_owners",
    "device_peaks",
    "event_counts",
    "event_timeline",
    "fingerprint",
    "gpu_series",
    "kernel_stats",
    "last_step_ns",
    "latest_step",
    "list_runs",
    "newest_run",
    "page_accounting",
    "page_map_at",
    "page_maps",
    "page_state_matrix",
    "raw_rows",
    "reader",
    "request_times",
    "request_trace",
    "requests_table",
    "resolve_status",
    "run_info",
    "run_summary",
    "step_pages",
    "step_series",
    "transfer_costs",
]
