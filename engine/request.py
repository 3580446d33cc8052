"""A request's state as it moves through waiting -> running -> finished.

``num_computed`` counts the leading tokens whose K/V are in the request's
pages (prefix-cache hits included). Each step computes the next tokens from
there; a request samples only when its computed tokens reach its full length,
which makes decode, chunked prefill and recompute-after-preemption one code
path.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from kvscope.engine.sampler import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    arrival_ns: int
    prompt: str = ""
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0  # prompt tokens served by the prefix cache at first admission
    status: Status = Status.WAITING
    finish_reason: str | None = None
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finish_ns: int | None = None
    num_preemptions: int = 0
    max_len: int = 0  # hard cap on prompt + output (the model's context)
    generator: torch.Generator | None = None
    text: str = ""
    cache_node: Any = None  # deepest prefix-cache node this request's pages reached
    cached_pages: int = 0  # leading pages already offered to the prefix cache
    host_slots: list[int] = field(default_factory=list)  # where a swapped-out request's pages are

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)
