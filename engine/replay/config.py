"""What a replay is asked to do and what it answers, apart from the machinery that runs it.

``ReplayConfig`` (with its choices ``TIMINGS`` and the replicas' ``ROUTINGS``)
and ``ReplayResult`` are plain dataclasses; the driver (engine/replay/driver.py)
builds the engine's scheduler, KV-cache manager and radix cache, which import
torch. Keeping them here lets ``kvscope replay --help`` (and every other
command, whose parser is built with this one's) name the choices and defaults
without importing torch; driver.py, routing.py and sweep.py take them from here.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from kvscope.engine.errors import KvscopeError
from kvscope.engine.eviction import POLICIES
from kvscope.engine.presets import device_preset, model_preset
from kvscope.engine.replay.traces import TraceEntry
from kvscope.engine.sizing import kv_bytes_per_token

TIMINGS = ("sequential", "roofline")
ROUTINGS = ("round-robin", "least-loaded", "prefix-aware")  # engine/replay/routing.py


@dataclass(slots=True)
class ReplayConfig:
    capacity_tokens: int | None = None  # None: unlimited (nothing is ever evicted)
    page_size: int = 512
    eviction_policy: str = "lru"
    timing: str = "sequential"
    offload: str = "never"  # never | always | auto (reload when cheaper than recompute)
    host_tokens: int = 0  # host tier size for offload / swap
    preemption: str = "recompute"
    max_batched_tokens: int = 8192  # roofline only; sequential runs a request in one step
    max_num_seqs: int = 256
    model: str = "llama3-8b"  # preset: bytes per token and the roofline's parameters
    kv_dtype: str = "fp16"
    device: str = "h100-80"  # roofline device preset
    speed: float = 1.0  # roofline: arrival times divided by this
    page_maps: int = 200  # page-map snapshots per recorded run (about)
    check_every: int = 0  # steps between full integrity checks (tests); 0 = never
    # Cache pages that hold output tokens too (the live engine does). Off by default: a
    # hash-id trace already names every prompt block, a previous turn's output included,
    # so fresh output pages would hold the same memory twice and never hit.
    cache_outputs: bool = False
    # Requests longer than this (prompt + output) are refused, as vLLM refuses a request
    # beyond the model's context; None: no limit.
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise KvscopeError(message)

        check(self.capacity_tokens is None or self.capacity_tokens > 0, "capacity must be > 0")
        check(self.page_size >= 1, "page size must be >= 1")
        check(
            self.eviction_policy in POLICIES,
            f"eviction policy must be one of {', '.join(POLICIES)}",
        )
        check(self.timing in TIMINGS, f"timing must be one of {', '.join(TIMINGS)}")
        check(self.offload in ("never", "always", "auto"), "offload must be never, always or auto")
        check(self.preemption in ("recompute", "swap"), "preemption must be recompute or swap")
        check(self.speed > 0, "speed must be > 0")
        check(self.max_batched_tokens >= 1 and self.max_num_seqs >= 1, "batch limits must be >= 1")
        check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len must be >= 1")
        model_preset(self.model)  # raise on unknown names here, before anything runs
        if self.timing == "roofline":
            device_preset(self.device)

    def admits(self, entry: TraceEntry) -> bool:
        """Whether ``entry`` fits the context (prompt + at least one output token, as vLLM
        checks prompt + max_tokens): a request beyond it is refused at arrival."""
        return self.max_model_len is None or request_tokens(entry) <= self.max_model_len

    @property
    def bytes_per_token(self) -> float:
        m = model_preset(self.model)
        return kv_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, self.kv_dtype)


@dataclass(slots=True)
class ReplayResult:
    requests: int
    finished: int
    rejected: int
    queried_tokens: int
    hit_tokens: int
    steps: int
    evicted_pages: int
    offloaded_pages: int
    reloaded_pages: int
    preemptions: int
    pool_pages: int
    capacity_tokens: int | None
    wall_s: float
    cpu_s: float  # this process's CPU time over the replay (a recorder's writer thread included)
    simulated_s: float
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    queue_mean_s: float | None = None
    queue_p99_s: float | None = None
    # The rejected requests by reason ("context", "capacity"): {"count", "first", "tokens"},
    # the first being the trace line (or recorded request) of the first one refused.
    refused: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def summary(self) -> dict:
        out = asdict(self)
        out["hit_rate"] = self.hit_rate
        return out


def request_tokens(entry: TraceEntry) -> int:
    """What a request holds at its end: its prompt and at least one output token."""
    return entry.input_len + max(1, entry.output_len)


def default_workers() -> int:
    """Processes a sweep runs its points on when not told (engine/replay/sweep.py)."""
    return max(1, min(2, os.cpu_count() or 1))
