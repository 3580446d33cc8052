"""Passkey retrieval: a 5-digit key hidden at a chosen depth of filler text, then asked for.

The prompt follows the usual passkey test (Mohtashami & Jaggi, 2023): an
instruction, repeated filler sentences, the key sentence at ``depth`` (0 = start,
1 = end) of the filler, and a question the model answers by continuing
"The pass key is". The answer counts as correct when the key appears in the
first generated tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

INSTRUCTION = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.\n\n"
)
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
QUESTION = "\nWhat is the pass key? The pass key is"
# The instruction, key sentence and question take about 70 tokens in SmolLM2's tokenizer;
# a prompt needs room for them and some filler. Checked before a model loads.
PASSKEY_MIN_TOKENS = 128


@dataclass(frozen=True, slots=True)
class PasskeyCase:
    num_tokens: int
    depth: float
    key: str
    prompt_ids: list[int]


def passkey_key(num_tokens: int, depth: float, seed: int = 0) -> str:
    """A 5-digit key that depends on the case, so no two cases share an answer by accident."""
    return str(random.Random(f"{seed}/{num_tokens}/{depth}").randint(10000, 99999))


def build_case(
    encode: Callable[[str], list[int]], num_tokens: int, depth: float, seed: int = 0
) -> PasskeyCase:
    """A prompt of exactly ``num_tokens`` tokens with the key at ``depth`` of the filler."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    key = passkey_key(num_tokens, depth, seed)
    head = encode(INSTRUCTION)
    needle = encode(f"The pass key is {key}. Remember it. {key} is the pass key. ")
    tail = encode(QUESTION)
    unit = encode(FILLER)
    room = num_tokens - len(head) - len(needle) - len(tail)
    if room < 0:
        raise ValueError(f"{num_tokens} tokens cannot hold the passkey prompt")
    filler = (unit * (room // len(unit) + 1))[:room]
    at = int(round(depth * room))
    ids = head + filler[:at] + needle + filler[at:] + tail
    return PasskeyCase(num_tokens, depth, key, ids)
