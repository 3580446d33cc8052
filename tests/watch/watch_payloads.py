"""Events in the exact shapes vLLM and SGLang put on the wire (msgpack-ready)."""

from __future__ import annotations

from typing import Any


def vllm_stored(
    hashes: list[int], parent: int | None = None, *, block_size: int = 16, medium: str = "GPU"
) -> dict[str, Any]:
    """vLLM >= 0.24: a map with the fields without defaults always present (null if unset)."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(block_size * len(hashes))),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def vllm_removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": 0}


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
