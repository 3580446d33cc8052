"""Deterministic long English text for perplexity evaluations, built from a small bundled corpus.

Sentences are composed from five slots (who, did what, to what, where, when)
drawn by a seeded generator and grouped into paragraphs, so a text of any
length is grammatical, varied (about 170,000 distinct sentences) and the same
on every machine, with no download.
"""

from __future__ import annotations

import random

WHO = (
    "The old miller",
    "A young teacher",
    "The harbour master",
    "My grandmother",
    "The village baker",
    "A tired traveller",
    "The head gardener",
    "Our new neighbour",
    "The station clerk",
    "A quiet student",
    "The ferry captain",
    "The night watchman",
    "A curious child",
    "The blacksmith's daughter",
)
DID = (
    "carried",
    "painted",
    "repaired",
    "sold",
    "counted",
    "found",
    "described",
    "wrapped",
    "measured",
    "forgot",
    "cleaned",
    "borrowed",
)
WHAT = (
    "a basket of apples",
    "the broken clock",
    "two wooden chairs",
    "a letter from the city",
    "the blue fishing boat",
    "an old map of the valley",
    "a jar of honey",
    "the church bell rope",
    "three loaves of bread",
    "a box of candles",
    "the heavy iron gate",
    "a pair of leather boots",
    "the garden fence",
)
WHERE = (
    "near the river",
    "behind the school",
    "at the market",
    "in the empty barn",
    "beside the mill pond",
    "on the hill road",
    "under the bridge",
    "in the crowded square",
    "along the sea wall",
    "outside the library",
)
WHEN = (
    "before the rain started",
    "early on Sunday morning",
    "after the long winter",
    "while the bells were ringing",
    "just before sunset",
    "during the autumn fair",
    "on the first warm day of spring",
    "late in the evening",
    "as the fog lifted",
    "when the train was late",
)
CONNECTIVES = ("Later,", "Meanwhile,", "Afterwards,", "That same week,", "Nobody knew why, but")


def sentence(rng: random.Random) -> str:
    text = f"{rng.choice(WHO)} {rng.choice(DID)} {rng.choice(WHAT)} {rng.choice(WHERE)} {rng.choice(WHEN)}."
    if rng.random() < 0.2:
        lead = rng.choice(CONNECTIVES)
        text = f"{lead} {text[0].lower()}{text[1:]}"
    return text


def paragraphs(seed: int = 0):
    """An endless stream of paragraphs of 3-7 sentences."""
    rng = random.Random(seed)
    while True:
        yield " ".join(sentence(rng) for _ in range(rng.randint(3, 7)))


def long_text_ids(encode, num_tokens: int, seed: int = 0) -> list[int]:
    """Exactly ``num_tokens`` token ids of corpus text (whole paragraphs, the last one cut)."""
    ids: list[int] = []
    for para in paragraphs(seed):
        ids.extend(encode(para + "\n\n"))
        if len(ids) >= num_tokens:
            return ids[:num_tokens]
    raise AssertionError("unreachable: the paragraph stream is endless")
