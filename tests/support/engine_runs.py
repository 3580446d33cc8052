"""Driving an engine through a list of timed arrivals, checking its invariants as it goes."""

from __future__ import annotations

from kvscope.engine.engine import Engine
from kvscope.engine.sampler import SamplingParams


def run_all(
    engine: Engine, arrivals: list[tuple[int, list[int], int]], check=True
) -> dict[int, list[int]]:
    """Add requests at their arrival steps; step to the end, checking invariants."""
    pending = sorted(enumerate(arrivals), key=lambda a: a[1][0])
    outputs: dict[int, list[int]] = {}
    index: dict[int, int] = {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][0] <= step:
            position, (_, prompt, n) = pending.pop(0)
            rid = engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
            index[rid] = position
        for out in engine.step():
            if out.finished:
                outputs[index[out.request_id]] = out.token_ids
        if check:
            engine.kv.check_integrity()
        step += 1
        assert step < 5000, "engine made no progress"
    return outputs
