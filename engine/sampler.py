"""Sampling parameters and token selection (greedy, temperature, top-k, top-p, seeds).

Greedy rows of a batch are one ``argmax``; sampled rows use a per-request
``torch.Generator`` so a seeded request draws the same tokens whatever else is
in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.engine.errors import RequestError


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not (self.temperature >= 0):
            raise RequestError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    return logits


class SampledTokens:
    """One step's sampled tokens: on the device as soon as they are launched, on the host
    when ``tolist`` reads them.

    The step's one device-to-host read: the greedy tokens, and with them (in the
    same copy) the logits of the rows that draw, which are sampled on the CPU with
    the request's own generator, so the same seed draws the same tokens on every
    device. On CUDA the copy goes non-blocking into a pinned buffer and ``tolist``
    waits on its event, so the host can prepare the next step meanwhile (async
    scheduling feeds ``device`` to it as its decode inputs); on the CPU the read is
    immediate.
    """

    __slots__ = ("device", "drawn", "_params", "_generators", "_host", "_buffer", "_event")

    def __init__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        pinned: torch.Tensor | None = None,
    ) -> None:
        greedy = logits.argmax(-1)
        self.device = greedy  # every row's argmax: the tokens themselves when ``on_device``
        self.drawn = [i for i, p in enumerate(params) if not p.greedy]
        self._params = params
        self._generators = generators
        if self.drawn:
            index = torch.tensor(self.drawn).to(logits.device, non_blocking=True)
            rows = logits.index_select(0, index).float()
            # Token ids below 2**24 are exact in fp32, so both travel in one fp32 tensor.
            payload = torch.cat([greedy.float(), rows.flatten()])
        else:
            payload = greedy
        self._event = None
        self._buffer = None
        if payload.is_cuda:  # (``.device.type`` builds a torch.device: ten times the cost)
            n = payload.numel()
            if pinned is None or pinned.numel() < n or pinned.dtype != payload.dtype:
                pinned = torch.empty(n, dtype=payload.dtype, pin_memory=True)
            # The whole buffer is handed on, not this step's slice: a smaller step
            # must not shrink what the next, larger one finds.
            self._buffer = pinned
            host = pinned[:n]
            host.copy_(payload, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._host = host
        else:
            self._host = payload

    @property
    def on_device(self) -> bool:
        """Whether ``device`` holds every row's token (no row draws on the host)."""
        return not self.drawn

    @property
    def pinned(self) -> torch.Tensor | None:
        """The pinned host buffer the tokens land in, None on the CPU (a later step may
        reuse it once these are read)."""
        return self._buffer

    def tolist(self) -> list[int]:
        """The tokens on the host: waits for the copy, then draws the sampled rows."""
        if self._event is not None:
            self._event.synchronize()
        if not self.drawn:
            return self._host.tolist()
        host = self._host
        n = len(self._params)
        out = [int(t) for t in host[:n].tolist()]
        rows = host[n:].view(len(self.drawn), -1)
        for j, i in enumerate(self.drawn):
            p = self._params[i]
            row = _filter(rows[j] / p.temperature, p.top_k, p.top_p)
            out[i] = int(
                torch.multinomial(row.softmax(-1), 1, generator=self._generators[i]).item()
            )
        return out


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token per row of ``logits`` [R, vocab] (``SampledTokens``, read at once)."""
    return SampledTokens(logits, params, generators).tolist()
