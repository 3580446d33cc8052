"""Tile sizes, warps and pipeline stages of the Triton kernels, chosen per device.

Each kernel has a short list of candidate configs. On a GPU,
``triton.autotune`` times the candidates that fit the device the first time
it meets a shape class (head dim, KV format, GQA group, page size, and a
power-of-two bucket of the query length or of the tokens per decode split)
and keeps the fastest, in the process and in Triton's on-disk cache (keyed by
the GPU architecture and the kernel source). A candidate fits when its shared
memory, estimated from its tiles, element sizes and stages, is within the
device's per-block limit (227 KiB on sm_90): fp32 tiles at head_dim 128 and
above are what that rules out. ``tests/kernels/sm90_compile.py`` compiles
every candidate kept for sm_90 at every head-dim class and checks the
estimate against what the compiler allocates. The interpreter gets one small config:
it has no speed to tune, and 16-wide tiles make small tests cross tile edges.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
import triton

from kvscope.kernels.triton_kv import interpreting

SM90_SHARED_BYTES = 227 * 1024  # what an H100/H200 block may opt in to
MAX_HEAD_DIM = 256


def check_head_dim(head_dim: int) -> None:
    if head_dim % 8 or not 8 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be a multiple of 8 up to {MAX_HEAD_DIM}, got {head_dim}")


def padded_head_dim(head_dim: int) -> int:
    """The tile width a head dim runs in: the next power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(head_dim))


def _kv_bytes(format_code: int, kv: torch.Tensor) -> float:
    """Bytes per stored K/V element (int4 packs two per byte)."""
    return kv.element_size() / (2 if format_code == 4 else 1)


def prefill_shared_bytes(
    block_m: int,
    block_n: int,
    num_stages: int,
    block_d: int,
    kv_bytes: float,
    dot_bytes: int,
    converted: bool,
) -> int:
    """Shared memory a prefill config needs, an upper estimate.

    The pipeline holds ``num_stages`` K and V tiles as loaded; Q sits there in
    the dot dtype (twice for fp32, whose "tf32x3" dots split it in two); K
    and V tiles that had to be converted (dequantized, or cast to another
    float type) are stored again in the dot dtype, where the tensor cores
    read them; and P for the second dot.
    """
    loads = num_stages * 2 * block_n * block_d * kv_bytes
    q_copies = 2 if dot_bytes == 4 else 1
    operands = q_copies * block_m * block_d + block_m * block_n
    if converted:
        operands += 2 * block_n * block_d
    return int(loads + operands * dot_bytes)


def decode_shared_bytes(
    block_h: int,
    block_n: int,
    num_stages: int,
    block_d: int,
    kv_bytes: float,
    dot_bytes: int,
    int4: bool,
) -> int:
    """Shared memory a decode config needs, an upper estimate.

    Decode's ``BLOCK_H`` (16) query rows are too few for wgmma, so its dots
    take converted tiles from registers; only int4's nibble interleave goes
    through shared memory. The compiler does not multi-buffer the page-table
    loads today; the estimate still counts ``num_stages - 1`` tile sets in
    flight, Q (twice for fp32), P twice, and 4 KiB of scratch.
    """
    loads = max(1, num_stages - 1) * 2 * block_n * block_d * kv_bytes
    q_copies = 2 if dot_bytes == 4 else 1
    operands = q_copies * block_h * block_d + 2 * block_h * block_n
    if int4:
        operands += block_n * block_d
    return int(loads + operands * dot_bytes) + 4096


def shared_memory_limit(device: torch.device) -> int:
    """Bytes of shared memory one program may use on ``device``."""
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def fitting(
    configs: list[triton.Config], need: Callable[[triton.Config], int], limit: int
) -> list[triton.Config]:
    """The configs within ``limit`` bytes; the smallest one if none is."""
    kept = [c for c in configs if need(c) <= limit]
    return kept or [min(configs, key=need)]


def _tile_bytes(kwargs: dict[str, Any], kv: torch.Tensor) -> tuple[float, int, bool]:
    """Stored and dot bytes per element of a launch, and whether its K/V tiles are converted."""
    dot_bytes = kwargs["DOT_DTYPE"].primitive_bitwidth // 8
    kv_bytes = _kv_bytes(kwargs["FORMAT"], kv)
    return kv_bytes, dot_bytes, kv_bytes != dot_bytes


def prefill_need(kwargs: dict[str, Any], kv: torch.Tensor) -> Callable[[triton.Config], int]:
    """Shared-memory estimate of each prefill config for one launch (its constexpr ``kwargs``)."""
    kv_bytes, dot_bytes, converted = _tile_bytes(kwargs, kv)

    def need(config: triton.Config) -> int:
        return prefill_shared_bytes(
            config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_stages,
            kwargs["BLOCK_D"], kv_bytes, dot_bytes, converted,
        )  # fmt: skip

    return need


def decode_need(kwargs: dict[str, Any], kv: torch.Tensor) -> Callable[[triton.Config], int]:
    """Shared-memory estimate of each decode config for one launch (its constexpr ``kwargs``)."""
    kv_bytes, dot_bytes, _ = _tile_bytes(kwargs, kv)

    def need(config: triton.Config) -> int:
        return decode_shared_bytes(
            kwargs["BLOCK_H"], config.kwargs["BLOCK_N"], config.num_stages,
            kwargs["BLOCK_D"], kv_bytes, dot_bytes, kwargs["FORMAT"] == 4,
        )  # fmt: skip

    return need


def _prune_prefill(configs: list[triton.Config], nargs: dict, **kwargs: Any) -> list[triton.Config]:
    return fitting(
        configs, prefill_need(kwargs, nargs["K"]), shared_memory_limit(nargs["Q"].device)
    )


def _prune_decode(configs: list[triton.Config], nargs: dict, **kwargs: Any) -> list[triton.Config]:
    return fitting(configs, decode_need(kwargs, nargs["K"]), shared_memory_limit(nargs["Q"].device))


def prefill_candidates() -> list[triton.Config]:
    """The prefill configs autotuning chooses from on a GPU: from the large
    tiles that suit 16-bit dots up to head_dim 128 down to the small ones fp32
    needs at 256."""
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in (
            (128, 64, 8, 3),
            (128, 64, 4, 3),
            (128, 128, 8, 2),
            (64, 64, 4, 2),
            (64, 32, 4, 2),
            (32, 32, 4, 2),
        )
    ]


def decode_candidates() -> list[triton.Config]:
    """The decode configs autotuning chooses from on a GPU. Longer key tiles
    amortize each tile's softmax over more bytes, which matters most for the
    1-byte and 4-bit formats."""
    return [
        triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s)
        for n, w, s in ((64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3), (256, 8, 2), (32, 4, 2))
    ]


# Decode splits are whole multiples of this many tokens, so every BLOCK_N
# candidate tiles a split exactly and the merge kernel needs no config.
DECODE_SPLIT_ALIGN = 16 if interpreting() else max(c.kwargs["BLOCK_N"] for c in decode_candidates())


def autotune_cache_kwargs(version: str | None = None) -> dict[str, Any]:
    """``cache_results=True`` (tunings kept on disk) where Triton has it: 3.4 and later.

    Older Tritons refuse the keyword, and ``kernels`` would fail at import; there
    each process tunes again (start-up tuning still keeps it outside timed runs).
    """
    major, minor = (int(p) for p in re.findall(r"\d+", version or triton.__version__)[:2])
    return {"cache_results": True} if (major, minor) >= (3, 4) else {}


def prefill_autotune(fn: Any) -> Any:
    """``triton.autotune`` over the prefill candidates, keyed by shape class."""
    configs = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16})] if interpreting() else None
    return triton.autotune(
        configs or prefill_candidates(),
        key=["HEAD_DIM", "FORMAT", "GROUP", "CAUSAL", "PAGED", "PAGE_SIZE", "q_class"],
        prune_configs_by={"early_config_prune": _prune_prefill},
        **autotune_cache_kwargs(),
    )(fn)


def decode_autotune(fn: Any) -> Any:
    """``triton.autotune`` over the decode candidates, keyed by shape class."""
    configs = [triton.Config({"BLOCK_N": 16})] if interpreting() else None
    return triton.autotune(
        configs or decode_candidates(),
        key=["HEAD_DIM", "FORMAT", "BLOCK_H", "PAGE_SIZE", "split_class"],
        prune_configs_by={"early_config_prune": _prune_decode},
        **autotune_cache_kwargs(),
    )(fn)


def length_class(n: int) -> int:
    """Power-of-two bucket of a length: one tuning per bucket, not per length."""
    return triton.next_power_of_2(max(1, n))
