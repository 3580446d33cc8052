"""A short recorded InfLLM run of the tiny model, for the front-end tests: two long
prompts whose distant blocks leave the device, so every step records retrievals
(and the engine's measured memory budget)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import Event, EventBus
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import VOCAB, tiny_loaded
from kvscope.profiler.recorder import Recorder


def infllm_config() -> EngineConfig:
    """A small InfLLM window (8 initial + 16 local tokens, top-3 blocks of 2 pages): prompts
    of a few hundred tokens send most of their blocks to the host."""
    return EngineConfig(
        page_size=4,
        kv_budget_bytes=1 << 20,
        max_batched_tokens=32,
        attention_mode="infllm",
        infllm_initial_tokens=8,
        infllm_local_tokens=16,
        infllm_block_pages=2,
        infllm_topk_blocks=3,
    )


def record_infllm(path: Path, also: Callable[[Event], None] | None = None) -> int:
    """Record the run into ``path``; returns its run id (about 2 s). ``also`` sees every event."""
    bus = EventBus()
    if also is not None:
        bus.subscribe(also)
    engine = Engine(infllm_config(), bus=bus, loaded=tiny_loaded(max_position=1024))
    recorder = Recorder(path, {"test": True}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (220, 120)]
    engine.generate(prompts, SamplingParams(max_tokens=12))
    recorder.finish("complete")
    return recorder.run_id
