"""Async scheduling's state: a step launched on the device whose tokens the host reads later.

With ``--async-scheduling on`` the engine launches step N+1 before it reads step
N's sampled tokens (vLLM v1's async scheduling): step N+1's decode rows take
their input tokens from step N's sampled-token tensor on the device
(``TokenFeed``), their pages are grown as if every running request continues,
and EOS, stop strings and max tokens are resolved when step N's tokens reach
the host, one step later. ``LaunchedStep`` is what stays in flight between the
two; on a GPU the host builds and launches the next step while the device
runs this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.engine.request import Request
from kvscope.engine.sampler import SampledTokens


@dataclass(slots=True)
class LaunchedStep:
    """A step whose forward and sampling are queued; its tokens are read by ``resolve``."""

    sampling: list[Request]  # one per sampled row, in row order
    tokens: SampledTokens


@dataclass(slots=True)
class TokenFeed:
    """Rows of the next step whose input token is one the step in flight sampled:
    ``token_ids[dst[i]] = tokens[src[i]]``, done on the device (no host read)."""

    tokens: torch.Tensor
    dst: list[int]
    src: list[int]
    # Row i takes token i for every fed row: one slice copy, no index tensors. Computed
    # once: staging and ``apply`` both ask, and each test is O(rows).
    in_order: bool = field(init=False)

    def __post_init__(self) -> None:
        self.in_order = self.dst == self.src == list(range(len(self.dst)))

    def apply(
        self,
        token_ids: torch.Tensor,
        dst: torch.Tensor | None = None,
        src: torch.Tensor | None = None,
    ) -> None:
        """Write the fed tokens into ``token_ids`` on its device; ``dst``/``src`` are the
        index lists already staged on the device (``in_order`` needs none; without them
        they are made here)."""
        if self.in_order:
            n = len(self.dst)
            token_ids[:n].copy_(self.tokens[:n])
            return
        if dst is None or src is None:
            dst = torch.tensor(self.dst, dtype=torch.long, device=token_ids.device)
            src = torch.tensor(self.src, dtype=torch.long, device=token_ids.device)
        token_ids.index_copy_(0, dst, self.tokens.index_select(0, src))


def feed_for(
    requests: list[Request], launched: LaunchedStep, num_new: list[int] | None = None
) -> TokenFeed | None:
    """The feed of a step run ahead of ``launched``: every request of ``requests`` that
    sampled in ``launched`` takes that token; None when none did. ``num_new``: the step's
    tokens per request when some take more than one (prefill chunks beside the fed
    decodes): ``dst`` then indexes the step's tokens, not its rows."""
    sampling = launched.sampling
    if requests == sampling:  # the common steady state: the same rows in the same order
        n = len(requests)
        return TokenFeed(launched.tokens.device, list(range(n)), list(range(n)))
    row = {id(req): i for i, req in enumerate(sampling)}
    dst: list[int] = []
    src: list[int] = []
    at = 0  # the row's first token in the step
    for i, req in enumerate(requests):
        j = row.get(id(req))
        # A request whose last prefill chunk is in flight sampled there too: it decodes
        # here like any other fed row.
        if j is not None:
            dst.append(at)
            src.append(j)
        at += 1 if num_new is None else num_new[i]
    return TokenFeed(launched.tokens.device, dst, src) if dst else None
