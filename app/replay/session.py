"""A sweep recorded: each point a run of kind ``replay`` in the database, written by a
Recorder in the point's worker, throttled so that no event is dropped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscope.engine.replay.config import (
    ReplayConfig,
    ReplayResult,
)
from kvscope.engine.replay.traces import ReplayTrace

if TYPE_CHECKING:
    from kvscope.engine.events import EventBus


class RecordSession:
    """Each point becomes a run of kind ``replay`` (one Recorder per point, in its worker)."""

    def __init__(self, db: Path, trace: ReplayTrace, sweep_id: str) -> None:
        self.db, self.trace, self.sweep_id = db, trace, sweep_id

    def run_config(self, config: ReplayConfig) -> dict[str, Any]:
        return {
            "capacity_tokens": config.capacity_tokens,
            "eviction_policy": config.eviction_policy,
            "page_size": config.page_size,
            "kv_dtype": config.kv_dtype,
            "preset": config.model,
            "timing": config.timing,
            "trace": self.trace.name,
            "sweep_id": self.sweep_id,
            "trace_format": self.trace.format,
            "block_size": self.trace.block_size,
            "requests": len(self.trace),
            "device": config.device if config.timing == "roofline" else None,
            "speed": config.speed if config.timing == "roofline" else None,
            "offload": config.offload,
            "host_tokens": config.host_tokens,
            "preemption": config.preemption,
            "cache_outputs": config.cache_outputs,
            "max_model_len": config.max_model_len,
        }

    def open(
        self, config: ReplayConfig
    ) -> tuple[EventBus, Callable[[ReplayResult | None, str], Any]]:
        from kvscope.engine.events import EventBus
        from kvscope.profiler.recorder import Recorder

        recorder = Recorder(self.db, self.run_config(config), model=config.model, kind="replay")
        recorder.start()
        bus = EventBus()
        on_event = recorder.on_event

        def throttled(event: Any) -> None:
            # A replay emits faster than SQLite takes rows: wait for the writer rather
            # than let the recorder's bounded queue drop events. Small batches also keep
            # each write transaction short, so two workers recording into one database
            # take turns well within SQLite's busy timeout.
            if recorder.queued > 20_000:
                while recorder.queued > 5_000:
                    time.sleep(0.002)
            on_event(event)

        bus.subscribe(throttled)

        def close(result: ReplayResult | None, status: str) -> int:
            recorder.finish(status)
            return recorder.run_id

        return bus, close
