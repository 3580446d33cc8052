"""Events in the exact shapes vLLM and SGLang put on the wire (msgpack-ready)."""

from __future__ import annotations

from typing import Any

from kvscope.profiler.watch.publisher import vllm_block_removed as vllm_removed
from kvscope.profiler.watch.publisher import vllm_block_stored as vllm_stored

__all__ = ["vllm_removed", "vllm_stored", "sglang_stored", "vllm_positional_stored"]


def vllm_positional_stored(
    hashes: list[int], parent: int | None = None, *, block_size: int = 16
) -> list[Any]:
    """vLLM <= 0.23: a tagged array; msgspec omits trailing defaults."""
    tokens = list(range(block_size * len(hashes)))
    return ["BlockStored", hashes, parent, tokens, block_size, None, "GPU"]


def sglang_stored(hashes: list[int], parent: int | None = None) -> dict[str, Any]:
    """SGLang: signed hashes, CPU_PINNED among its media, no group_idx."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "lora_id": None,
        "medium": "CPU_PINNED",
        "cache_salt": None,
    }


CLEARED = {"type": "AllBlocksCleared"}
