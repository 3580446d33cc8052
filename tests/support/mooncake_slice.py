"""The checked-in Mooncake trace slice (tests/data) and its hit-rate ceiling counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

SLICE = Path(__file__).resolve().parents[1] / "data" / "mooncake_conversation_head400.jsonl"


def reference_ceiling(path: Path, block: int = 512) -> float:
    """Unlimited capacity by hand: each request hits its longest prefix of full blocks
    seen before, and never its last token (vLLM's rule)."""
    seen: set[int] = set()
    hit = queried = 0
    for line in path.read_text().splitlines():
        r = json.loads(line)
        n, ids = r["input_length"], r["hash_ids"]
        h = 0
        for b in ids[: (n - 1) // block]:
            if b not in seen:
                break
            h += 1
        hit += h * block
        queried += n
        seen.update(ids[: n // block])
    return hit / queried
