"""What each layer of a model keeps per request: the attention forms of 2026's models.

A model's layers fall into groups that size alike (vLLM's KV cache groups):

- ``full``: K and V for every token (MHA, GQA, MQA);
- ``sliding``: K and V for the last ``window`` tokens only (gpt-oss, Gemma 2/3,
  Mistral's sliding layers);
- ``chunked``: K and V for the tokens of the current ``window``-token chunk
  (Llama 4's local layers); a request holds at most ``window`` of them;
- ``mla``: one compressed latent per token, ``latent_dim`` wide (DeepSeek-V3,
  Kimi K2: ``kv_lora_rank`` + ``qk_rope_head_dim``), not a K and a V per head;
- ``state``: a fixed state per request whatever its length (linear attention,
  Mamba: ``state_elements`` per layer), held in the KV dtype unless a state dtype
  says otherwise (vLLM's ``mamba_ssm_cache_dtype`` can keep it in fp32).

A request's bytes are the sum over groups; a windowed group's tokens stop
growing at its window, so at long context the full groups are what the budget
pays for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvscope.engine.errors import KvscopeError
from kvscope.engine.kv_formats import kv_dtype_spec

KINDS = ("full", "sliding", "chunked", "mla", "state")
WINDOWED = ("sliding", "chunked")
STATE_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Layers of one attention form that hold the same bytes per request."""

    kind: str
    layers: int
    kv_heads: int = 0  # full, sliding, chunked
    head_dim: int = 0
    window: int | None = None  # sliding, chunked: tokens
    latent_dim: int = 0  # mla: elements of the one vector a token keeps
    state_elements: int = 0  # state: elements per request per layer

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise KvscopeError(f"unknown attention form {self.kind!r}; one of {', '.join(KINDS)}")
        if self.layers < 1:
            raise KvscopeError("a layer group needs at least one layer")
        if self.kind in ("full", *WINDOWED) and (self.kv_heads < 1 or self.head_dim < 1):
            raise KvscopeError(f"{self.kind} layers need kv_heads and head_dim")
        if self.kind in WINDOWED and (self.window is None or self.window < 1):
            raise KvscopeError(f"{self.kind} layers need a window of at least one token")
        if self.kind == "mla" and self.latent_dim < 1:
            raise KvscopeError("mla layers need a latent width (kv_lora_rank + rope dims)")
        if self.kind == "state" and self.state_elements < 1:
            raise KvscopeError("state layers need their state's elements per request")

    @property
    def label(self) -> str:
        if self.kind in WINDOWED:
            return f"{self.kind} {self.window:,}"
        return self.kind

    def bytes_per_token(self, kv_dtype: str) -> float:
        """Bytes one held token costs across the group's layers (0 for a state)."""
        fmt = kv_dtype_spec(kv_dtype)
        if self.kind == "state":
            return 0.0
        if self.kind == "mla":
            return fmt.bytes_per_head_vector(self.latent_dim) * self.layers
        return 2 * self.kv_heads * fmt.bytes_per_head_vector(self.head_dim) * self.layers

    def state_bytes(self, kv_dtype: str, state_dtype: str | None = None) -> float:
        """Bytes of the fixed state one request holds across the group's layers."""
        if self.kind != "state":
            return 0.0
        return self.state_elements * self.layers * element_bytes(state_dtype or kv_dtype)

    def tokens_held(self, context_len: float) -> float:
        """Tokens of a ``context_len``-token request the group holds (a window's at most)."""
        if self.kind == "state":
            return 0.0
        if self.kind in WINDOWED:
            return min(context_len, self.window)
        return context_len


def element_bytes(dtype: str) -> float:
    """Bytes of one state element: a float format's width (an int KV format's state is
    kept at 16 bits, as vLLM keeps it in the model's dtype)."""
    if dtype in STATE_DTYPE_BYTES:
        return STATE_DTYPE_BYTES[dtype]
    if dtype in ("int8", "int4"):
        return 2
    raise KvscopeError(
        f"unknown state dtype {dtype!r}; choose one of {', '.join(STATE_DTYPE_BYTES)}"
    )


def full_group(layers: int, kv_heads: int, head_dim: int) -> LayerGroup:
    return LayerGroup("full", layers, kv_heads, head_dim)


def with_kv_heads(groups: tuple[LayerGroup, ...], kv_heads: int) -> tuple[LayerGroup, ...]:
    """The groups with ``kv_heads`` KV heads in every K/V-per-head layer (MHA/GQA/MQA)."""
    return tuple(
        replace(g, kv_heads=kv_heads) if g.kind in ("full", *WINDOWED) else g for g in groups
    )


def request_bytes(groups: tuple[LayerGroup, ...], context_len: float, kv_dtype: str,
                  state_dtype: str | None = None) -> float:  # fmt: skip
    """Bytes a request of ``context_len`` tokens holds, summed over groups."""
    return sum(
        g.tokens_held(context_len) * g.bytes_per_token(kv_dtype)
        + g.state_bytes(kv_dtype, state_dtype)
        for g in groups
    )


def longest_context(groups: tuple[LayerGroup, ...], budget_bytes: float, kv_dtype: str,
                    state_dtype: str | None = None) -> float:  # fmt: skip
    """The most tokens one request could hold within ``budget_bytes``: the budget less
    the fixed parts (states, full windows) over what every further token costs (the
    groups that hold every token). Infinite when no group grows with the context."""
    growing = sum(g.bytes_per_token(kv_dtype) for g in groups if g.kind in ("full", "mla"))
    fixed = sum(
        g.state_bytes(kv_dtype, state_dtype)
        + (g.window * g.bytes_per_token(kv_dtype) if g.kind in WINDOWED else 0.0)
        for g in groups
    )
    if not growing:
        return math.inf
    spare = budget_bytes - fixed
    if spare <= 0:
        # Even the windows do not fit whole: the request's tokens fill every group alike.
        states = sum(g.state_bytes(kv_dtype, state_dtype) for g in groups)
        per_token = sum(g.bytes_per_token(kv_dtype) for g in groups)
        return max(0.0, budget_bytes - states) / per_token
    return spare / growing
