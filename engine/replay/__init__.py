"""Trace replay: production traffic through the engine's own KV-cache manager, no model.

See engine/replay/driver.py for the API, traces.py for the formats, tokens.py
for how hash ids become page keys.
"""

from __future__ import annotations

from engine.replay.driver import (
    TIMINGS,
    Prepared,
    ReplayConfig,
    ReplayDriver,
    ReplayResult,
    prepare,
)
from engine.replay.traces import FORMATS, ReplayTrace, TraceEntry, read_replay_trace

__all__ = [
    "FORMATS",
    "TIMINGS",
    "Prepared",
    "ReplayConfig",
    "ReplayDriver",
    "ReplayResult",
    "ReplayTrace",
    "TraceEntry",
    "prepare",
    "read_replay_trace",
]
