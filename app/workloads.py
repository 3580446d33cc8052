"""Built-in workloads and the JSONL workload format for ``kvscope run``.

A workload is a list of ``WorkItem`` (prompt, output budget, arrival time).
Built-ins are deterministic for a seed and shaped to exercise the KV cache:

- ``chat``: a shared system prompt plus short user questions, Poisson arrivals
  (prefix hits, and under a small budget eviction and preemption);
- ``shared-prefix``: one long shared document, many short questions about it;
- ``multi-turn``: conversations whose later turns repeat the earlier ones;
- ``long-context``: few long prompts (chunked prefill, page pressure);
- ``mixed``: all of the above interleaved.

JSONL format, one object per line::

    {"prompt": "text", "max_tokens": 64, "arrival_s": 0.0, "system": "optional", "chat": true}

``prompt`` is required; the rest are optional (defaults shown). Blank lines
and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvscope.engine.errors import KvscopeError

BUILTIN = ("chat", "shared-prefix", "multi-turn", "long-context", "mixed")
MAX_REQUESTS = 100_000  # a built-in workload of more is a typo; building it would exhaust memory
MAX_ARRIVAL_S = 86_400.0  # an arrival later than a day would keep the run waiting for it


@dataclass(frozen=True, slots=True)
class WorkItem:
    prompt: str
    max_tokens: int = 64
    arrival_s: float = 0.0
    system: str | None = None
    chat: bool = True

    def messages(self, history: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + (history or []) + [{"role": "user", "content": self.prompt}]


SYSTEM_PROMPT = (
    "You are KV, the support assistant of a small cloud provider that rents GPU servers for "
    "language model inference. Answer in at most three short sentences. Be precise about units: "
    "memory in GiB, bandwidth in GB/s, compute in TFLOP/s. When a question is about sizing a "
    "deployment, say which quantity limits it (weights, KV cache, activations or framework "
    "overhead) before giving a number. Never invent prices. If a customer asks about a model you "
    "do not know, ask for its number of layers, key-value heads and head dimension, because those "
    "three numbers decide how much memory each token of context costs. Our servers come with one "
    "to eight GPUs; each GPU has its own memory and the KV cache of one request lives on the GPUs "
    "that serve it. Requests that share a system prompt can share its cached keys and values."
)

QUESTIONS = [
    "How much memory does one token of context cost?",
    "Why does my server run out of memory at long contexts?",
    "What is a KV cache?",
    "Can two requests share cached keys and values?",
    "Should I quantize the KV cache to eight bits?",
    "What limits the batch size on one GPU?",
    "How many users can one GPU serve at once?",
    "What happens when the cache is full?",
    "Is it faster to recompute a prefix or to load it from CPU memory?",
    "Why is decoding slower than reading the prompt?",
    "What is paged attention?",
    "How do I choose a page size?",
    "What is grouped-query attention and why does it save memory?",
    "Why do long prompts delay other users?",
    "What does preemption mean in a serving engine?",
    "How big is the KV cache of a 7B model at 4k context?",
]

DOCUMENT = (
    "Paged attention stores the keys and values of each request in fixed-size pages. A page table "
    "maps each request's logical token positions to physical pages, so memory is allocated on "
    "demand and returned when a request finishes. Internal fragmentation is limited to the last, "
    "partially filled page of each request. Prefix caching goes further: pages that hold the same "
    "tokens at the same positions can be shared by many requests, which skips their prefill. "
    "A radix tree over token ids finds the longest cached prefix of a new prompt in time "
    "proportional to its length. When memory runs short, unreferenced cached pages are evicted, "
    "either dropped and recomputed later or copied to host memory and reloaded on a later hit. "
)


def _poisson_arrivals(rng: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate) if rate > 0 else 0.0
    return out


def _chat(rng: random.Random, n: int, rate: float) -> list[WorkItem]:
    arrivals = _poisson_arrivals(rng, n, rate)
    return [
        WorkItem(
            rng.choice(QUESTIONS),
            max_tokens=rng.choice((24, 32, 48, 64)),
            arrival_s=a,
            system=SYSTEM_PROMPT,
        )
        for a in arrivals
    ]


def _shared_prefix(rng: random.Random, n: int, rate: float) -> list[WorkItem]:
    doc = DOCUMENT * 3
    arrivals = _poisson_arrivals(rng, n, rate)
    return [
        WorkItem(
            f"{doc}\nQuestion: {rng.choice(QUESTIONS)}",
            max_tokens=32,
            arrival_s=a,
            system=SYSTEM_PROMPT,
        )
        for a in arrivals
    ]


def _multi_turn(rng: random.Random, n: int, rate: float) -> list[WorkItem]:
    """Conversations of up to 3 turns: each turn's prompt repeats the previous turns."""
    items: list[WorkItem] = []
    arrivals = _poisson_arrivals(rng, n, rate)
    convo: list[str] = []
    for a in arrivals:
        if len(convo) == 3 or not convo:
            convo = []
        convo.append(rng.choice(QUESTIONS))
        transcript = "\n".join(f"User: {q}\nAssistant: (answered)" for q in convo[:-1])
        prompt = f"{transcript}\nUser: {convo[-1]}" if transcript else convo[-1]
        items.append(WorkItem(prompt, max_tokens=32, arrival_s=a, system=SYSTEM_PROMPT))
    return items


def _long_context(rng: random.Random, n: int, rate: float) -> list[WorkItem]:
    arrivals = _poisson_arrivals(rng, n, rate)
    out = []
    for a in arrivals:
        repeats = rng.randint(4, 8)
        out.append(
            WorkItem(
                DOCUMENT * repeats + "\nSummarize the text above in one sentence.",
                max_tokens=48,
                arrival_s=a,
            )
        )
    return out


def _mixed(rng: random.Random, n: int, rate: float) -> list[WorkItem]:
    makers = [_chat, _shared_prefix, _multi_turn, _long_context]
    parts = [makers[i % 4](rng, 1, rate)[0] for i in range(n)]
    arrivals = _poisson_arrivals(rng, n, rate)
    return [
        WorkItem(p.prompt, p.max_tokens, a, p.system, p.chat)
        for p, a in zip(parts, arrivals, strict=True)
    ]


_MAKERS = {
    "chat": _chat,
    "shared-prefix": _shared_prefix,
    "multi-turn": _multi_turn,
    "long-context": _long_context,
    "mixed": _mixed,
}


def builtin(name: str, requests: int, rate: float = 4.0, seed: int = 0) -> list[WorkItem]:
    if not 1 <= requests <= MAX_REQUESTS:
        raise KvscopeError(f"--requests must be 1 to {MAX_REQUESTS:,}, got {requests}")
    return _MAKERS[name](random.Random(seed), requests, rate)


WORKLOAD_FIELDS = ("prompt", "max_tokens", "arrival_s", "system", "chat")


def read_jsonl(path: Path) -> list[WorkItem]:
    """Parse a JSONL workload; a bad line is reported by number and reason."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise KvscopeError(f"cannot read workload {path}: {exc.strerror}") from None
    items = []
    for number, data in enumerate(lines, start=1):
        where = f"{path}:{number}"
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KvscopeError(f"{where}: not valid UTF-8 (byte {exc.start + 1})") from None
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise KvscopeError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise KvscopeError(f"{where}: expected a JSON object")
        unknown = set(raw) - set(WORKLOAD_FIELDS)
        if unknown:
            raise KvscopeError(
                f"{where}: unknown field(s) {', '.join(sorted(unknown))} "
                f"(a workload line has {', '.join(WORKLOAD_FIELDS)})"
            )
        prompt = raw.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise KvscopeError(f"{where}: 'prompt' must be a non-empty string")
        if not _encodable(prompt):  # a JSON escape of half a surrogate pair
            raise KvscopeError(f"{where}: 'prompt' is not valid Unicode")
        max_tokens = raw.get("max_tokens", 64)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise KvscopeError(f"{where}: 'max_tokens' must be a positive integer")
        arrival = raw.get("arrival_s", 0.0)
        if (
            not isinstance(arrival, (int, float))
            or isinstance(arrival, bool)
            or not 0 <= arrival <= MAX_ARRIVAL_S  # also refuses NaN
        ):
            raise KvscopeError(
                f"{where}: 'arrival_s' must be a number of seconds, 0 to {MAX_ARRIVAL_S:,.0f}"
            )
        system = raw.get("system")
        if system is not None and (not isinstance(system, str) or not _encodable(system)):
            raise KvscopeError(f"{where}: 'system' must be a string of valid Unicode")
        chat = raw.get("chat", True)
        if not isinstance(chat, bool):
            raise KvscopeError(f"{where}: 'chat' must be true or false")
        items.append(WorkItem(prompt, max_tokens, float(arrival), system, chat))
    if not items:
        raise KvscopeError(f"{path}: no requests in workload")
    return sorted(items, key=lambda it: it.arrival_s)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_workload(spec: str, requests: int, rate: float = 4.0, seed: int = 0) -> list[WorkItem]:
    if spec in BUILTIN:
        return builtin(spec, requests, rate, seed)
    path = Path(spec)
    if path.suffix == ".jsonl" or path.exists():
        return read_jsonl(path)
    raise KvscopeError(
        f"unknown workload {spec!r}: use one of {', '.join(BUILTIN)} or a .jsonl file"
    )
