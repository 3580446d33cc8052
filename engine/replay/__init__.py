"""Trace replay: production traffic through the engine's own KV-cache manager, no model.

See engine/replay/driver.py for the API, config.py for what a replay is asked
and answers, traces.py for the formats, tokens.py for how hash ids become page
keys.

The driver's names (``ReplayDriver``, ``Prepared``, ``prepare``) are imported
on first use, not with the package: the driver builds the engine's scheduler
and KV-cache manager, which import torch (about 2 s), and importing any
submodule (``config``, ``traces``, as every ``kvscope`` command's parser does)
imports this package first.
"""

from __future__ import annotations

from typing import Any

from kvscope.engine.replay.config import TIMINGS, ReplayConfig, ReplayResult
from kvscope.engine.replay.traces import FORMATS, ReplayTrace, TraceEntry, read_replay_trace

_FROM_DRIVER = ("Prepared", "ReplayDriver", "prepare")


def __getattr__(name: str) -> Any:
    if name in _FROM_DRIVER:
        from kvscope.engine.replay import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
