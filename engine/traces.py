"""Request traces for the allocation simulator: built-in length distributions or a JSONL file.

The ShareGPT-like distribution is lognormal with the means reported for the
ShareGPT conversations in the vLLM paper (161 prompt tokens, 338 output tokens),
clipped so that every request fits the context length.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvscope.engine.errors import KvscopeError

DISTRIBUTIONS = ("sharegpt", "uniform", "fixed")
SHAREGPT_PROMPT_MEAN, SHAREGPT_OUTPUT_MEAN = 161, 338
SHAREGPT_SIGMA = 1.0


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: tokens in, tokens out, and when it arrives (seconds from the start)."""

    prompt_len: int
    output_len: int
    arrival_s: float = 0.0

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def generate_trace(
    distribution: str = "sharegpt",
    num_requests: int = 200,
    *,
    prompt_len: int = 512,
    output_len: int = 512,
    max_len: int = 2048,
    rate: float = 0.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """``num_requests`` requests of at most ``max_len`` tokens each.

    ``fixed`` gives every request ``prompt_len`` in and ``output_len`` out;
    ``uniform`` draws each from 1 up to twice those (same means); ``sharegpt``
    ignores them. ``rate`` > 0 spaces arrivals as a Poisson process of that many
    requests per second; 0 means all arrive at once.
    """
    if distribution not in DISTRIBUTIONS:
        raise KvscopeError(
            f"unknown trace distribution {distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}"
        )
    if num_requests < 1 or prompt_len < 1 or output_len < 1:
        raise KvscopeError("request count, prompt and output lengths must be positive")
    if max_len < 2:
        raise KvscopeError("the maximum request length must be at least 2 tokens")
    if distribution == "fixed" and prompt_len + output_len > max_len:
        raise KvscopeError(f"fixed requests of {prompt_len + output_len} tokens exceed {max_len}")
    rng = random.Random(seed)
    requests = []
    arrival = 0.0
    for _ in range(num_requests):
        if distribution == "fixed":
            p, o = prompt_len, output_len
        elif distribution == "uniform":
            p, o = rng.randint(1, 2 * prompt_len - 1), rng.randint(1, 2 * output_len - 1)
        else:
            p = round(_lognormal(rng, SHAREGPT_PROMPT_MEAN, SHAREGPT_SIGMA))
            o = round(_lognormal(rng, SHAREGPT_OUTPUT_MEAN, SHAREGPT_SIGMA))
        p = min(max(p, 1), max_len - 1)
        o = min(max(o, 1), max_len - p)
        requests.append(TraceRequest(p, o, arrival))
        if rate > 0:
            arrival += rng.expovariate(rate)
    return requests


def _positive_int(record: dict, key: str, where: str) -> int:
    if key not in record:
        raise KvscopeError(f"{where}: missing {key!r}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KvscopeError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def jsonl_records(path: str | Path, comments: bool = False) -> Iterator[tuple[str, dict]]:
    """``(path:line, object)`` for each non-blank line of a JSONL file (and, with
    ``comments``, not starting with ``#``); a bad line raises ``KvscopeError`` naming it."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise KvscopeError(f"cannot read trace {path}: {reason}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip() or (comments and line.lstrip().startswith("#")):
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise KvscopeError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise KvscopeError(f"{where}: expected a JSON object")
        yield where, record


def is_time(value: object) -> bool:
    """A finite number of seconds >= 0 (a JSON bool is no number; NaN and infinity had
    hung a replay or been tracebacks)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < math.inf


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Read JSONL: one object per line with ``prompt_len``, ``output_len``, optional ``arrival_s``."""
    path = Path(path)
    requests = []
    for where, record in jsonl_records(path):
        arrival = record.get("arrival_s", 0.0)
        if not is_time(arrival):
            raise KvscopeError(f"{where}: arrival_s must be a finite number >= 0, got {arrival!r}")
        requests.append(
            TraceRequest(
                _positive_int(record, "prompt_len", where),
                _positive_int(record, "output_len", where),
                float(arrival),
            )
        )
    if not requests:
        raise KvscopeError(f"trace {path} has no requests")
    return requests
