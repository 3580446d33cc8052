"""KV-cache sizing math shared by the engine (page pool size) and ``kvscope calc``.

bytes per token = 2 (K and V) x kv_heads x head_dim x layers x bytes per element,
where quantized formats also pay for their scales. The KV budget is what a device
has left after weights, framework overhead and activations; how many requests fit
in it depends on how many tokens each holds on average. Units: bytes; GiB = 2**30.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from kvscope.engine.attention_forms import (
    WINDOWED,
    LayerGroup,
    full_group,
    longest_context,
    request_bytes,
    with_kv_heads,
)
from kvscope.engine.errors import KvscopeError
from kvscope.engine.kv_formats import KV_DTYPES, KVFormat, kv_dtype_spec  # noqa: F401  (sizing's API)
from kvscope.engine.model_config import ModelConfig

GIB = 1 << 30
MIB = 1 << 20


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str = "fp16"
) -> float:
    """Bytes of K and V one token occupies across all layers, scales included."""
    return 2 * num_kv_heads * num_layers * kv_dtype_spec(kv_dtype).bytes_per_head_vector(head_dim)


def pool_pages(budget_bytes: int, bytes_per_token: float, page_size: int) -> int:
    """Whole KV pages a budget holds, as the engine sizes its pool; fewer than two is
    the engine's refusal, which ``info`` and the checks before a model load share."""
    page_bytes = bytes_per_token * page_size
    pages = int(budget_bytes // page_bytes)
    if pages < 2:
        raise KvscopeError(
            f"KV budget of {budget_bytes} bytes holds {pages} pages of {page_bytes:.0f} bytes; "
            "raise --kv-budget"
        )
    return pages


# Bytes per parameter for the weights; int4 ignores its small per-group scales.
WEIGHT_BYTES_PER_PARAM = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What KV sizing needs of a model; explicit command-line shapes give no more."""

    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    params: int | None = None
    context_len: int | None = None
    # The layers by attention form (engine.attention_forms); none given: every layer
    # full attention with the shape's KV heads and head_dim.
    groups: tuple[LayerGroup, ...] = ()
    source: str | None = None  # where a preset's figures come from

    def __post_init__(self) -> None:
        for field in ("layers", "q_heads", "kv_heads", "head_dim"):
            if getattr(self, field) < 1:
                raise KvscopeError(f"{field} must be a positive integer")
        if self.q_heads % self.kv_heads:
            raise KvscopeError(
                f"{self.q_heads} query heads do not split into groups for {self.kv_heads} KV heads"
            )
        if not self.groups:
            object.__setattr__(
                self, "groups", (full_group(self.layers, self.kv_heads, self.head_dim),)
            )
        elif sum(g.layers for g in self.groups) != self.layers:
            raise KvscopeError(
                f"{self.name}: its layer groups hold {sum(g.layers for g in self.groups)} "
                f"layers, not {self.layers}"
            )

    @property
    def hybrid(self) -> bool:
        """Whether any layer keeps less (or other) than K and V for every token."""
        return any(g.kind != "full" for g in self.groups)

    def request_bytes(self, context_len: float, kv_dtype: str = "fp16",
                      state_dtype: str | None = None) -> float:  # fmt: skip
        """Bytes one request of ``context_len`` tokens holds, summed over the groups."""
        return request_bytes(self.groups, context_len, kv_dtype, state_dtype)

    def avg_request_bytes(self, input_tokens: float, output_tokens: float,
                          kv_dtype: str = "fp16", state_dtype: str | None = None,
                          residency: Residency | None = None) -> float:  # fmt: skip
        """Bytes a request holds on average over its life (it grows from ``input_tokens``
        to their sum), summed over the groups (``group_avg_request_bytes``)."""
        return sum(self.group_avg_request_bytes(input_tokens, output_tokens, kv_dtype,
                                                state_dtype, residency))  # fmt: skip

    def group_avg_request_bytes(self, input_tokens: float, output_tokens: float,
                                kv_dtype: str = "fp16", state_dtype: str | None = None,
                                residency: Residency | None = None) -> list[float]:  # fmt: skip
        """Each group's share of ``avg_request_bytes``: its tokens averaged as it holds
        them (a window's at most its window, whatever the residency's share), or its
        fixed state."""
        residency = FULL if residency is None else residency
        out = []
        for g in self.groups:
            if g.kind == "state":
                out.append(g.state_bytes(kv_dtype, state_dtype))
                continue
            held = residency
            if g.kind in WINDOWED:
                cap = g.window if residency.tokens is None else min(g.window, residency.tokens)
                held = Residency(tokens=cap)
            out.append(
                g.bytes_per_token(kv_dtype) * avg_tokens_held(input_tokens, output_tokens, held)
            )
        return out

    def longest_context(self, budget_bytes: float, kv_dtype: str = "fp16",
                        state_dtype: str | None = None) -> float:  # fmt: skip
        """Tokens one request could hold within ``budget_bytes`` (windows and states paid)."""
        return longest_context(self.groups, budget_bytes, kv_dtype, state_dtype)

    @property
    def kv_width(self) -> int:
        """One layer's K (or V) width per token: D_model / GQA group size."""
        return self.kv_heads * self.head_dim

    def growing_bytes_per_token(self, kv_dtype: str = "fp16") -> float:
        """Bytes each further token of a long context costs: the groups that hold every
        token (full, MLA); windows stop growing and states are fixed. What reloading a
        long evicted prefix moves per token."""
        return sum(g.bytes_per_token(kv_dtype) for g in self.groups if g.kind in ("full", "mla"))

    def bytes_per_token(self, kv_dtype: str = "fp16") -> float:
        """Bytes one token held by every group costs: the sum over the groups (a model
        of full-attention layers alone: 2 x kv_heads x head_dim x layers x bytes)."""
        return sum(g.bytes_per_token(kv_dtype) for g in self.groups)

    def kv_head_variants(self) -> dict[str, ModelShape]:
        """The same model with one KV head per query head (MHA), grouped heads (GQA), and one
        (MQA). GQA is the model's own grouping, or for an MHA model a real comparison: the
        largest divisor of its query heads up to 8 (Llama 3's 8 KV heads)."""
        gqa = self
        if self.kv_heads == self.q_heads > 1:
            heads = max(d for d in range(1, min(8, self.q_heads - 1) + 1) if self.q_heads % d == 0)
            gqa = replace(self, kv_heads=heads)
        return {
            "MHA": self._with_kv_heads(self.q_heads),
            "GQA": gqa if gqa is self else self._with_kv_heads(gqa.kv_heads),
            "MQA": self._with_kv_heads(1),
        }

    def _with_kv_heads(self, kv_heads: int) -> ModelShape:
        return replace(self, kv_heads=kv_heads, groups=with_kv_heads(self.groups, kv_heads))

    @classmethod
    def from_config(cls, config: ModelConfig, params: int | None = None) -> ModelShape:
        return cls(
            config.name,
            config.num_layers,
            config.num_q_heads,
            config.num_kv_heads,
            config.head_dim,
            params or config.num_params,
            config.max_position,
        )

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelShape:
        """A Hugging Face ``config.json``; parameters are counted from the shapes it lists."""
        return cls.from_config(ModelConfig.from_hf_config(path))

    @classmethod
    def from_gguf(cls, path: str | Path) -> ModelShape:
        """A GGUF file's metadata; parameters are counted from its tensors (tied or not)."""
        import gguf  # not engine.gguf_file: sizing needs neither torch nor the tokenizer

        path = Path(path)
        if not path.is_file():
            raise KvscopeError(f"no GGUF file at {path}")
        try:
            reader = gguf.GGUFReader(path)
        except Exception as exc:  # the reader raises ValueError/IndexError/struct errors
            raise KvscopeError(f"{path} is not a readable GGUF file: {exc}") from None
        # The tokenizer's arrays are most of the metadata and none of the shape.
        fields = {
            key: field.contents()
            for key, field in reader.fields.items()
            if not key.startswith(("GGUF.", "tokenizer."))
        }
        config = ModelConfig.from_gguf_fields(fields, name=path.stem)
        return cls.from_config(config, sum(int(t.n_elements) for t in reader.tensors))


def weight_bytes(params: int, weight_dtype: str = "fp16") -> float:
    """2P bytes at fp16/bf16, P at int8, P/2 at int4."""
    try:
        return params * WEIGHT_BYTES_PER_PARAM[weight_dtype]
    except KeyError:
        raise KvscopeError(
            f"unknown weight dtype {weight_dtype!r}; choose one of "
            f"{', '.join(WEIGHT_BYTES_PER_PARAM)}"
        ) from None


@dataclass(frozen=True, slots=True)
class Residency:
    """How much of a request's KV stays on the device: ``fraction`` of its tokens, at most ``tokens``.

    The default keeps everything resident. InfLLM keeps attention sinks, a local
    window and the retrieved blocks resident and the rest of the history in the
    host tier, so a request never holds more than its resident budget.
    """

    tokens: float | None = None
    fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.tokens is not None and self.tokens <= 0:
            raise KvscopeError(f"resident tokens must be positive, got {self.tokens}")
        if not 0 < self.fraction <= 1:
            raise KvscopeError(f"resident fraction must be in (0, 1], got {self.fraction}")


FULL = Residency()


def avg_tokens_held(
    input_tokens: float, output_tokens: float, residency: Residency = FULL
) -> float:
    """Tokens a request holds resident on average over its life.

    Its context grows from ``input_tokens`` to ``input_tokens + output_tokens`` during
    decode, so with everything resident it holds input + output/2. A resident cap
    N (``fraction`` f) holds min(f x context, N) = f x min(context, N/f): the
    average rises with the context until the cap, then stays flat.
    """
    f = residency.fraction
    cap = math.inf if residency.tokens is None else residency.tokens / f
    end = input_tokens + output_tokens
    if cap >= end:
        return f * (input_tokens + output_tokens / 2)
    if cap <= input_tokens or output_tokens == 0:
        return f * cap
    rise = cap - input_tokens  # decode tokens before the cap is reached
    return f * (rise * (input_tokens + cap) / 2 + (end - cap) * cap) / output_tokens


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """A device's memory and what is spent before the KV cache gets any."""

    memory_bytes: float
    weight_bytes: float
    overhead_bytes: float = 1.5 * GIB
    activation_bytes: float = 0.0

    @property
    def spare_bytes(self) -> float:
        """Memory after weights, overhead and activations; negative when they do not fit."""
        return self.memory_bytes - self.weight_bytes - self.overhead_bytes - self.activation_bytes

    @property
    def kv_bytes(self) -> float:
        return max(0.0, self.spare_bytes)


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """How much of a workload a KV budget holds, for one bytes-per-token figure."""

    kv_bytes_per_token: float
    kv_bytes_per_request: float
    max_avg_batch: int
    max_batch_max_reservation: int
    tokens_in_budget: int


def shape_capacity(shape: ModelShape, budget_bytes: float, kv_dtype: str, per_request: float,
                   max_model_len: int, state_dtype: str | None = None) -> KVCapacity:  # fmt: skip
    """``kv_capacity`` for a model of any attention forms: requests of ``per_request``
    bytes on average, a max-length reservation of what a ``max_model_len`` request
    holds, and the tokens one request could hold (windows and states paid first)."""
    longest = shape.longest_context(budget_bytes, kv_dtype, state_dtype)
    return KVCapacity(
        kv_bytes_per_token=shape.bytes_per_token(kv_dtype),
        kv_bytes_per_request=per_request,
        max_avg_batch=math.floor(budget_bytes / per_request),
        max_batch_max_reservation=math.floor(
            budget_bytes / shape.request_bytes(max_model_len, kv_dtype, state_dtype)
        ),
        tokens_in_budget=math.floor(min(longest, 2**62)),
    )


def kv_capacity(
    budget_bytes: float, bytes_per_token: float, avg_tokens: float, max_model_len: int
) -> KVCapacity:
    """Batches that fit: on average tokens held, and when each request reserves max length."""
    per_request = bytes_per_token * avg_tokens
    return KVCapacity(
        kv_bytes_per_token=bytes_per_token,
        kv_bytes_per_request=per_request,
        max_avg_batch=math.floor(budget_bytes / per_request),
        max_batch_max_reservation=math.floor(budget_bytes / (bytes_per_token * max_model_len)),
        tokens_in_budget=math.floor(budget_bytes / bytes_per_token),
    )


@dataclass(frozen=True, slots=True)
class ReloadCost:
    """Seconds per token to recompute an evicted KV cache versus reloading it over PCIe."""

    recompute_s: float
    load_s: float

    @property
    def recompute_over_load(self) -> float:
        """(bandwidth x P) / (dtype x kv_width x L x compute); above 1, reloading wins."""
        return self.recompute_s / self.load_s


def reload_cost(
    params: float, kv_bytes_per_token: float, pcie_gbps: float, tflops: float
) -> ReloadCost:
    """Recomputing costs a forward pass, 2P FLOPs per token; reloading moves its K and V."""
    return ReloadCost(
        recompute_s=2 * params / (tflops * 1e12),
        load_s=kv_bytes_per_token / (pcie_gbps * 1e9),
    )


def compute_bound_batch(
    tflops: float, hbm_gbps: float, weight_bytes_per_param: float = 2.0
) -> float:
    """The decode batch at which a device stops waiting on its memory: its ridge point.

    A decode step reads every weight once and spends 2 FLOPs on it per sequence
    in the batch, so its arithmetic intensity is 2B / (bytes per parameter)
    FLOP/byte; it is compute-bound once that reaches FLOP/s over bytes/s. With
    16-bit weights B = FLOP/s / bytes/s: about 1,000 TFLOP/s over 3 TB/s is 333.
    The KV cache reads of attention are left out, as in the seed note's model.
    """
    return tflops * 1e12 / (hbm_gbps * 1e9) * weight_bytes_per_param / 2


@dataclass(frozen=True, slots=True)
class ContextShape:
    """How a context of L tokens splits into prompt and output: the prompt is ``input_share`` of it."""

    input_share: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.input_share <= 1:
            raise KvscopeError(
                f"the prompt's share of a context must be in (0, 1], got {self.input_share}"
            )

    @classmethod
    def of(cls, input_tokens: int, output_tokens: int) -> ContextShape:
        return cls(input_tokens / (input_tokens + output_tokens))

    def avg_tokens_held(self, context_len: float, residency: Residency = FULL) -> float:
        prompt = context_len * self.input_share
        return avg_tokens_held(prompt, context_len - prompt, residency)


def batch_at_context(
    budget_bytes: float,
    bytes_per_token: float,
    context_len: float,
    shape: ContextShape,
    residency: Residency = FULL,
) -> int:
    """The average batch a KV budget holds when every request grows to ``context_len`` tokens."""
    return math.floor(
        budget_bytes / (bytes_per_token * shape.avg_tokens_held(context_len, residency))
    )


# Past this many tokens of context a batch that has not fallen never will: only a
# resident cap keeps it up, and that cap is reached long before.
_CLIFF_SEARCH_LIMIT = 1 << 40


def cliff_context(
    budget_bytes: float,
    bytes_per_token: float,
    needed_batch: float,
    shape: ContextShape,
    residency: Residency = FULL,
) -> int | None:
    """The longest context at which the KV budget still holds ``needed_batch`` requests.

    One token longer and the batch the budget allows falls below what keeps the
    device compute-bound: the throughput cliff. 0 when even a 1-token context is
    short of the batch; None when the batch never falls below it (a resident cap
    that holds enough requests at any length).
    """
    return _longest_true(
        lambda n: (
            batch_at_context(budget_bytes, bytes_per_token, n, shape, residency) >= needed_batch
        )
    )


def shape_batch_at_context(model: ModelShape, budget_bytes: float, context_len: float,
                           split: ContextShape, kv_dtype: str, state_dtype: str | None = None,
                           residency: Residency = FULL) -> int:  # fmt: skip
    """``batch_at_context`` for a model of any attention forms: each layer group's bytes
    over the request's life (a window's at most its window), its states whole."""
    prompt = context_len * split.input_share
    per_request = model.avg_request_bytes(
        prompt, context_len - prompt, kv_dtype, state_dtype, residency
    )
    return math.floor(budget_bytes / per_request)


def shape_cliff_context(model: ModelShape, budget_bytes: float, needed_batch: float,
                        split: ContextShape, kv_dtype: str, state_dtype: str | None = None,
                        residency: Residency = FULL) -> int | None:  # fmt: skip
    """``cliff_context`` for a model of any attention forms."""
    return _longest_true(
        lambda n: (
            shape_batch_at_context(model, budget_bytes, n, split, kv_dtype, state_dtype, residency)
            >= needed_batch
        )
    )


def _longest_true(enough) -> int | None:
    """The largest context length n with ``enough(n)``, for an ``enough`` that holds up
    to some length and not past it: 0 when not even at 1, None when at every length."""
    if not enough(1):
        return 0
    low, high = 1, 2
    while enough(high):
        if high >= _CLIFF_SEARCH_LIMIT:
            return None
        low, high = high, high * 2
    while high - low > 1:  # enough(low) and not enough(high)
        mid = (low + high) // 2
        low, high = (mid, high) if enough(mid) else (low, mid)
    return low
