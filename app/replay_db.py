"""A recorded kvscope run as a replay trace: its requests, with page-level content ids.

The database keeps no tokens, but its page events say which content each
request's prompt held: pages it got from the prefix cache on admission were
content stored earlier, and pages it computed itself became content when the
cache stored them (BlockStored carries each stored block's chain hash, so one
block keeps one id across evictions and copies). Each request becomes a trace
line whose "hash ids" are those content ids, one per full prompt page, so a
replay at another capacity sees the same sharing. Pages are read by their
position in the request: after a preemption (recompute or swap) or a retreat,
the request's next pages are its prompt from the start again.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvscope.db.page_replay import _REPLAY_ORDER
from kvscope.db.runs import choose_run
from kvscope.db.source import stored_json
from kvscope.db.store import open_db
from kvscope.engine.errors import KvscopeError
from kvscope.engine.replay.traces import ReplayTrace, TraceEntry


def trace_from_run(path: Path, run_id: int | None) -> ReplayTrace:
    db = open_db(path, create=False)
    try:
        run = choose_run(db, run_id)
        conn = db.conn
        row = conn.execute("SELECT config, start_ns FROM runs WHERE id = ?", (run,)).fetchone()
        config = stored_json(row[0], run, "config")
        page_size = int(config.get("page_size") or 16)
        requests = conn.execute(
            "SELECT request_id, arrival_ns, prompt_tokens, COALESCE(output_tokens, max_tokens, 1) "
            "FROM requests WHERE run_id = ? AND rejected_reason IS NULL AND arrival_ns IS NOT NULL "
            "ORDER BY arrival_ns, request_id",
            (run,),
        ).fetchall()
        if not requests:
            raise KvscopeError(f"run {run} in {path} has no requests to replay")
        events = conn.execute(
            "SELECT kind, request_id, payload FROM events WHERE run_id = ? AND kind IN "
            "('pages_allocated', 'pages_freed', 'block_stored', 'block_removed') "
            # emission order, as db.pages replays it: the recorder writes a batch's rows
            # kind by kind, so ids alone put allocations before the stores that came first
            f"ORDER BY step, ts_ns, {_REPLAY_ORDER}, id",
            (run,),
        ).fetchall()
    finally:
        db.conn.close()
    blocks = _prompt_blocks(events)
    start = requests[0][1]
    entries = []
    unique = blocks.next_id
    for rid, arrival, prompt, output in requests:
        ids = blocks.of(rid, prompt // page_size)
        for i, b in enumerate(ids):
            if b is None:  # never stored (no prefix cache, a run cut short): its own content
                ids[i] = unique = unique + 1
        entries.append(
            TraceEntry(
                (arrival - start) / 1e9, prompt, max(1, output or 1), ids,
                where=f"{path.name}#run{run} request {rid}",
            )
        )  # fmt: skip
    return ReplayTrace(f"{path.name}#run{run}", "db", page_size, entries)


class _PromptBlocks:
    """Each request's pages by position, as content ids, from the page events in order.

    A request's pages are its positions 0, 1, ... in allocation order until it frees
    them (finished, preempted, or a retreat before admission); its next allocation
    starts again at position 0: a recompute's re-match and recomputation, or a swap-in.
    A cached page names its content at once; a page the request computes is named when
    the cache stores it, or lists it as a copy of a block it has (computed at the same
    time); a page freed before that is never named for it. Content is the block's chain
    hash (in a recording from before BlockStored carried hashes: the page and how many
    times it was stored). Whatever a request holds at one position is one block, so ids
    named at one position are merged (in older recordings, a block recomputed after its
    eviction).
    """

    def __init__(self) -> None:
        self.next_id = 0
        self.by_content: dict[tuple[int, int], int] = {}  # (0, hash) or (page, n) -> id
        self.stores: dict[int, int] = {}  # page -> times stored (recordings without hashes)
        self.page_id: dict[int, int] = {}  # page -> content id of its latest store
        self.merged: dict[int, int] = {}  # content id -> an id it was merged with
        self.cached: set[int] = set()
        self.slots: dict[int, list[int | None]] = {}  # request -> content id per position
        self.held: dict[int, int] = {}  # request -> pages it holds now (its next position)
        self.waiting: dict[int, list[tuple[int, int]]] = {}  # page -> (request, position)

    def content(self, key: tuple[int, int]) -> int:
        if key not in self.by_content:
            self.next_id += 1
            self.by_content[key] = self.next_id
        return self.by_content[key]

    def find(self, i: int) -> int:
        root = i
        while root in self.merged:
            root = self.merged[root]
        while i != root:  # path compression
            self.merged[i], i = root, self.merged[i]
        return root

    def name(self, rid: int, pos: int, content: int) -> None:
        slots = self.slots[rid]
        if slots[pos] is None:
            slots[pos] = content
        else:
            a, b = self.find(slots[pos]), self.find(content)
            if a != b:
                self.merged[max(a, b)] = min(a, b)

    def allocated(self, rid: int, pages: list[int]) -> None:
        slots = self.slots.setdefault(rid, [])
        first = self.held.get(rid, 0)
        slots.extend([None] * (first + len(pages) - len(slots)))
        for pos, p in enumerate(pages, first):
            if p in self.cached:
                self.name(rid, pos, self.page_id[p])
            else:
                self.waiting.setdefault(p, []).append((rid, pos))
        self.held[rid] = first + len(pages)

    def freed(self, rid: int, pages: list[int]) -> None:
        self.held[rid] = 0
        for p in pages:
            left = [w for w in self.waiting.get(p, ()) if w[0] != rid]
            if left:
                self.waiting[p] = left
            else:
                self.waiting.pop(p, None)

    def copied(self, pages: list[int], hashes: list[int]) -> None:
        """A request's pages holding blocks the cache has already (its own copies)."""
        for p, h in zip(pages, hashes, strict=True):
            for rid, pos in self.waiting.pop(p, ()):
                self.name(rid, pos, self.content((0, h)))

    def stored(self, pages: list[int], hashes: list[int]) -> None:
        for i, p in enumerate(pages):
            if i < len(hashes):
                c = self.content((0, hashes[i]))
            else:
                self.stores[p] = n = self.stores.get(p, 0) + 1
                c = self.content((p, n))
            self.page_id[p] = c
            self.cached.add(p)
            for rid, pos in self.waiting.pop(p, ()):
                self.name(rid, pos, c)

    def of(self, rid: int, n: int) -> list[int | None]:
        """The first ``n`` positions of request ``rid`` (None: never named)."""
        slots = self.slots.get(rid, [])[:n]
        return [None if s is None else self.find(s) for s in slots] + [None] * (n - len(slots))


def _prompt_blocks(events: list[tuple[str, int, str]]) -> _PromptBlocks:
    blocks = _PromptBlocks()
    for kind, rid, payload in events:
        values = json.loads(payload)
        pages = values.get("pages", [])
        if kind == "pages_allocated":
            blocks.allocated(rid, pages)
        elif kind == "pages_freed":
            blocks.freed(rid, pages)
        elif kind == "block_stored":
            # older recordings have no hashes
            blocks.stored(pages, values.get("hashes", []))
            blocks.copied(values.get("copies", []), values.get("copy_hashes", []))
        else:
            blocks.cached.difference_update(pages)
    return blocks
