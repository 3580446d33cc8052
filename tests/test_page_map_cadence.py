"""Page-map snapshots: every N steps, and no closer together than the configured interval.

A GPU steps every few milliseconds; at 100k pages a snapshot costs a millisecond or two
on the engine's thread and ~20 kB in the database, so CUDA runs space them in time.
"""

from __future__ import annotations

from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import EventBus, PageMap
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import tiny_engine


def _snapshot_steps(interval_s: float) -> tuple[list[int], int]:
    bus = EventBus()
    steps: list[int] = []
    bus.subscribe(lambda e: steps.append(e.step) if isinstance(e, PageMap) else None)
    engine = tiny_engine(64, bus=bus, page_map_every=4, page_map_interval_s=interval_s)
    engine.generate(["t1 t2 t3 t4 t5"] * 3, SamplingParams(max_tokens=12))
    return steps, engine.step_count


def test_every_n_steps_without_an_interval():
    steps, total = _snapshot_steps(0.0)
    assert total >= 12
    assert steps == list(range(0, total, 4))[: len(steps)] and len(steps) >= total // 4


def test_an_interval_longer_than_the_run_leaves_the_first_snapshot_only():
    steps, total = _snapshot_steps(3600.0)
    assert total >= 12 and steps == [0]


def test_the_interval_defaults_by_device():
    assert EngineConfig(device="cpu").page_map_interval_s == 0.0
    assert EngineConfig(device="cpu", page_map_interval_s=0.5).page_map_interval_s == 0.5
