"""Production request traces for the replay: Mooncake, Qwen-Bailian, kvscope JSONL.

Each format becomes one ``ReplayTrace``: requests in arrival order, each with its
input and output lengths and its content, either block hash ids (``blocks``, at
``block_size`` tokens a block; equal ids mean reusable content) or token ids
(``tokens``). ``page_contents`` then turns each request's full prompt pages into
integer page keys (engine/replay/tokens.py), whatever the page size.

Formats (``detect_format`` reads the first record):

- ``mooncake``: ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (512-token blocks unless told);
- ``bailian``: the Alibaba Qwen-Bailian trace, ``chat_id``, ``parent_chat_id``,
  ``timestamp`` (s), ``input_length``, ``output_length``, ``type``, ``turn``,
  ``hash_ids`` at 16-token blocks;
- ``kvscope``: kvscope's JSONL, ``prompt_token_ids`` (token ids) or
  ``prompt_len`` (lengths only: content unique to each request), with
  ``max_tokens``/``output_len`` and ``arrival_s``. Text prompts (``prompt``) need
  a tokenizer, so the command turns them into token ids first (``encode``).

A line whose hash ids do not cover ``input_length`` (``len(hash_ids) !=
ceil(input_length / block_size)``) is kept and counted: missing blocks are new
content, extra ids are ignored; the command warns with the count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.engine.errors import KvscopeError
from kvscope.engine.replay.tokens import NEVER, KeySpace
from kvscope.engine.traces import is_time, jsonl_records

FORMATS = ("mooncake", "bailian", "kvscope")
DEFAULT_BLOCK_SIZE = {"mooncake": 512, "bailian": 16}
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(slots=True)
class TraceEntry:
    """One request of a trace."""

    arrival_s: float
    input_len: int
    output_len: int
    blocks: list[int] | None = None  # hash ids at block_size tokens a block
    tokens: list[int] | None = None  # token ids (kvscope traces)
    # Where it came from ("trace.jsonl:7", "r.db#run3 request 12"): a refusal names it.
    where: str = ""


@dataclass(slots=True)
class ReplayTrace:
    name: str
    format: str
    block_size: int
    entries: list[TraceEntry]
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def inconsistent(self) -> tuple[int, int]:
        """(short, long): requests of a Mooncake or Bailian trace whose hash ids do not
        match ceil(input_length / block_size), of those kept (``--limit 200`` had
        warned of 12,031 of 200: the whole file's count)."""
        bs = self.block_size
        if self.format not in DEFAULT_BLOCK_SIZE:  # a run's pages: full ones only, by design
            return 0, 0
        short = long = 0
        for e in self.entries:
            want = -(-e.input_len // bs)
            short += len(e.blocks) < want
            long += len(e.blocks) > want
        return short, long

    @property
    def input_tokens(self) -> int:
        return sum(e.input_len for e in self.entries)

    def head(self, n: int) -> ReplayTrace:
        """The first ``n`` requests (scaling rows, tests)."""
        return ReplayTrace(self.name, self.format, self.block_size, self.entries[:n])


def detect_format(record: dict) -> str | None:
    if "hash_ids" in record:
        return "bailian" if "chat_id" in record or "parent_chat_id" in record else "mooncake"
    if any(k in record for k in ("prompt_token_ids", "prompt_len", "prompt")):
        return "kvscope"
    return None


def is_database(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


# Tokens in one request's prompt or output at most: longer than any model's context, and
# short enough that its pages (one key each) and decode steps fit in memory.
MAX_REQUEST_TOKENS = 10**8


def _int(record: dict, key: str, where: str, minimum: int = 0) -> int:
    if key not in record:
        raise KvscopeError(f"{where}: missing {key!r}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KvscopeError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_REQUEST_TOKENS:
        raise KvscopeError(f"{where}: {key} {value:,} is above {MAX_REQUEST_TOKENS:,} tokens")
    return value


def _number(record: dict, key: str, where: str, default: float | None = None) -> float:
    value = record.get(key, default)
    if value is None:
        raise KvscopeError(f"{where}: missing {key!r}")
    if not is_time(value):
        raise KvscopeError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    return float(value)


def _ints(record: dict, key: str, where: str) -> list[int]:
    value = record.get(key)
    if not isinstance(value, list) or not all(
        type(v) is int and v >= 0 for v in value
    ):  # one C-level pass; a trace line has tens of ids
        raise KvscopeError(f"{where}: {key} must be a list of integers >= 0")
    return value


def read_replay_trace(
    path: str | Path,
    fmt: str | None = None,
    block_size: int | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> ReplayTrace:
    """Parse a JSONL trace; malformed lines raise ``KvscopeError`` naming ``path:line``."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise KvscopeError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    entries: list[TraceEntry] = []
    bs = block_size
    for where, record in jsonl_records(path, comments=True):
        if fmt is None:
            fmt = detect_format(record)
            if fmt is None:
                raise KvscopeError(
                    f"{where}: unknown trace format (no hash_ids, prompt_token_ids or "
                    f"prompt_len); give --format {'|'.join(FORMATS)}"
                )
        if bs is None:
            bs = DEFAULT_BLOCK_SIZE.get(fmt, 0)
        if fmt == "kvscope":
            entries.append(_kvscope_entry(record, where, encode))
            continue
        n_in = _int(record, "input_length", where, 1)
        blocks = _ints(record, "hash_ids", where)
        ts = _number(record, "timestamp", where)
        entries.append(
            TraceEntry(
                ts / 1000.0 if fmt == "mooncake" else ts,
                n_in,
                _int(record, "output_length", where, 0),
                blocks,
                where=where,
            )
        )
    if not entries:
        raise KvscopeError(f"trace {path} has no requests")
    entries.sort(key=lambda e: e.arrival_s)  # stable: ties keep the file's order
    return ReplayTrace(path.name, fmt, bs or 0, entries)


def _kvscope_entry(
    record: dict, where: str, encode: Callable[[str], list[int]] | None
) -> TraceEntry:
    arrival = _number(record, "arrival_s", where, 0.0)
    out_key = "max_tokens" if "max_tokens" in record else "output_len"
    output = _int(record, out_key, where, 1) if out_key in record else 64
    if "prompt_token_ids" in record:
        tokens = _ints(record, "prompt_token_ids", where)
        if not tokens:
            raise KvscopeError(f"{where}: prompt_token_ids is empty")
        return TraceEntry(arrival, len(tokens), output, tokens=tokens, where=where)
    if "prompt_len" in record:
        return TraceEntry(arrival, _int(record, "prompt_len", where, 1), output, where=where)
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise KvscopeError(f"{where}: prompt must be a non-empty string")
    if encode is None:
        raise KvscopeError(f"{where}: a text prompt needs a tokenizer")
    tokens = encode(prompt)
    return TraceEntry(arrival, len(tokens), output, tokens=tokens, where=where)


# --- page contents --------------------------------------------------------------------


def _page_content(entry: TraceEntry, page: int, ps: int, bs: int) -> tuple | int | None:
    """What page ``page`` (a full prompt page) holds: one block id, a tuple of pieces, or
    None when a block it covers has no id (new content)."""
    lo, hi = page * ps, (page + 1) * ps
    if entry.tokens is not None:
        return tuple(entry.tokens[lo:hi])
    blocks = entry.blocks
    if blocks is None:
        return None
    first, last = lo // bs, (hi - 1) // bs
    if last >= len(blocks):
        return None
    if ps == bs:
        return blocks[first]
    if first == last:  # a page inside one block: the block and where in it
        return (blocks[first], lo - first * bs)
    # pieces of several blocks: ids, and where the first starts (ps not a multiple of bs)
    return (*blocks[first : last + 1], lo - first * bs, hi - last * bs)


def page_contents(
    trace: ReplayTrace, page_size: int, space: KeySpace | None = None
) -> tuple[list[list[int]], KeySpace]:
    """Each request's full prompt pages as integer keys (equal content, equal key)."""
    space = space or KeySpace()
    key, fresh = space.key, space.fresh
    bs = trace.block_size
    out = []
    for entry in trace.entries:
        n = entry.input_len // page_size
        if entry.blocks is not None and page_size == bs:  # the common case, one dict op a page
            have = min(n, len(entry.blocks))
            keys = [key(b) for b in entry.blocks[:have]]
            keys += [fresh() for _ in range(n - have)]
        else:
            keys = []
            for page in range(n):
                content = _page_content(entry, page, page_size, bs)
                keys.append(fresh() if content is None else key(content))
        out.append(keys)
    return out, space


def next_uses(keys: list[list[int]]) -> list[list[int]]:
    """For each request's page ``i``, the index of the next request that needs the same
    prefix path up to ``i`` (what a radix node is), or ``NEVER``: belady's knowledge."""
    paths: dict[tuple[int, int], int] = {}
    path_ids = []
    for ks in keys:
        parent, ids = 0, []
        for k in ks:
            pid = paths.get((parent, k))
            if pid is None:
                pid = paths[(parent, k)] = len(paths) + 1
            ids.append(pid)
            parent = pid
        path_ids.append(ids)
    seen: dict[int, int] = {}
    uses: list[list[int]] = [[]] * len(keys)
    for r in range(len(keys) - 1, -1, -1):
        ids = path_ids[r]
        uses[r] = [seen.get(p, NEVER) for p in ids]
        for p in ids:
            seen[p] = r
    return uses
