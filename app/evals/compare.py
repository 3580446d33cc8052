"""Full attention and InfLLM on the same inputs: passkey accuracy, perplexity, resident KV.

Both engines share one loaded model; each gets the same configuration except
its attention mode. Resident KV per request is what the request holds on the
device: for full attention every token's K/V (whole pages); for InfLLM the
largest ``resident_bytes`` its retrieval events reported (sinks, local
window, the prefill chunk being computed, the retrieved-block cache and the
block summaries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from kvscope.app.evals.corpus import long_text_ids
from kvscope.app.evals.passkey import build_case
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import Event, InfLLMRetrieval
from kvscope.engine.loader import LoadedModel
from kvscope.engine.sampler import SamplingParams

MODES = ("full", "infllm")
SCORE_REQUEST = -1  # the request id Engine.score runs under
ANSWER_TOKENS = 8  # the key's five digits fit in a few tokens after "The pass key is"


@dataclass(slots=True)
class PasskeyRow:
    num_tokens: int
    depth: float
    key: str
    mode: str
    answer: str
    correct: bool
    resident_bytes: int
    full_bytes: int

    @property
    def resident_fraction(self) -> float:
        return self.resident_bytes / self.full_bytes


@dataclass(slots=True)
class PerplexityRow:
    num_tokens: int
    mode: str
    perplexity: float
    top1_agreement: float  # argmax equal to full attention's, over every position
    resident_bytes: int
    full_bytes: int

    @property
    def resident_fraction(self) -> float:
        return self.resident_bytes / self.full_bytes


class ResidentTracker:
    """Largest device-resident KV per request, from InfLLM's retrieval events."""

    def __init__(self) -> None:
        self.peak: dict[int, int] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, InfLLMRetrieval):
            rid = event.request_id
            self.peak[rid] = max(self.peak.get(rid, 0), event.resident_bytes)


class Comparison:
    """One engine per attention mode over one loaded model."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        # The host tier must hold every offloaded page of the longest request.
        host = max(config.host_budget_bytes, config.kv_budget_bytes or 0)
        config = replace(config, host_budget_bytes=host)
        # Both configurations are validated before the model loads.
        configs = {mode: replace(config, attention_mode=mode) for mode in MODES}
        full = Engine(configs["full"], loaded=loaded)
        infllm = Engine(configs["infllm"], loaded=full.loaded)
        self.engines = {"full": full, "infllm": infllm}
        self.tracker = ResidentTracker()
        infllm.bus.subscribe(self.tracker)
        self.codec = full.codec

    def full_bytes(self, num_tokens: int) -> int:
        """Device bytes full attention holds for ``num_tokens`` (whole pages)."""
        engine = self.engines["full"]
        ps = engine.config.page_size
        return int(-(-num_tokens // ps) * ps * engine.bytes_per_token)

    def resident_bytes(self, mode: str, request_id: int, num_tokens: int) -> int:
        if mode == "full":
            return self.full_bytes(num_tokens)
        # A request too short to have distant blocks emits no retrieval event: all resident.
        return self.tracker.peak.get(request_id, self.full_bytes(num_tokens))

    def passkey(self, num_tokens: int, depth: float, seed: int = 0) -> list[PasskeyRow]:
        case = build_case(self.codec.encode, num_tokens, depth, seed)
        rows = []
        for mode in MODES:
            engine = self.engines[mode]
            out = engine.generate([case.prompt_ids], SamplingParams(max_tokens=ANSWER_TOKENS))[0]
            rid = out.request_id
            total = num_tokens + len(out.token_ids)
            rows.append(
                PasskeyRow(
                    num_tokens,
                    depth,
                    case.key,
                    mode,
                    out.text,
                    case.key in out.text,
                    self.resident_bytes(mode, rid, total),
                    self.full_bytes(total),
                )
            )
        return rows

    def perplexity(self, num_tokens: int, chunk: int, seed: int = 0) -> list[PerplexityRow]:
        ids = long_text_ids(self.codec.encode, num_tokens, seed)
        targets = torch.tensor(ids[1:] + [0])
        results = {}
        for mode in MODES:
            engine = self.engines[mode]
            done = [0]

            def reduce(logits: torch.Tensor, done: list[int] = done) -> torch.Tensor:
                start = done[0]
                done[0] += len(logits)
                logp = torch.log_softmax(logits.float(), dim=-1)
                nll = -logp.gather(1, targets[start : done[0], None])[:, 0]
                return torch.stack([nll, logits.argmax(-1).float()], dim=1)

            self.tracker.peak.pop(SCORE_REQUEST, None)  # score() always runs as request -1
            kept = engine.score(ids, chunk=chunk, reduce=reduce)
            results[mode] = (kept, self.resident_bytes(mode, SCORE_REQUEST, num_tokens))
        rows = []
        full_top1 = results["full"][0][:-1, 1]
        for mode in MODES:
            kept, resident = results[mode]
            nll = kept[:-1, 0]  # the last position has no next token
            rows.append(
                PerplexityRow(
                    num_tokens,
                    mode,
                    math.exp(nll.mean().item()),
                    (kept[:-1, 1] == full_top1).float().mean().item(),
                    resident,
                    self.full_bytes(num_tokens),
                )
            )
        return rows
