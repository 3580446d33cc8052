"""A recorded kvscope run as a replay trace: its requests, with page-level content ids.

The database keeps no tokens, but its page events say which content each
request's prompt held: pages it got from the prefix cache on admission were
content stored earlier (a page id and how many times that page had been
stored), and pages it computed itself became new content when the cache stored
them. Each request becomes a trace line whose "hash ids" are those content ids,
one per full prompt page, so a replay at another capacity sees the same sharing.
"""

from __future__ import annotations

import json
from pathlib import Path

from db.runs import choose_run
from db.store import open_db
from engine.errors import KvscopeError
from engine.replay.traces import ReplayTrace, TraceEntry


def trace_from_run(path: Path, run_id: int | None) -> ReplayTrace:
    db = open_db(path, create=False)
    try:
        run = choose_run(db, run_id)
        conn = db.conn
        row = conn.execute("SELECT config, start_ns FROM runs WHERE id = ?", (run,)).fetchone()
        config = json.loads(row[0] or "{}")
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
            "('pages_allocated', 'block_stored', 'block_removed') ORDER BY id",
            (run,),
        ).fetchall()
    finally:
        db.conn.close()
    generation: dict[int, int] = {}  # page -> how many times it was stored (its content id)
    cached: set[int] = set()
    pages_of: dict[int, list[int | tuple[int, int]]] = {}
    waiting: dict[int, list[tuple[list, int]]] = {}  # page -> slots to fill when it is stored
    next_id = [0]
    ids: dict[tuple[int, int], int] = {}

    def content(page: int) -> int:
        key = (page, generation.get(page, 0))
        if key not in ids:
            ids[key] = next_id[0] = next_id[0] + 1
        return ids[key]

    for kind, rid, payload in events:
        pages = json.loads(payload).get("pages", [])
        if kind == "pages_allocated":
            held = pages_of.setdefault(rid, [])
            for p in pages:
                if p in cached:
                    held.append(content(p))
                else:  # computed by this request: its content is named when it is stored
                    held.append(None)
                    waiting.setdefault(p, []).append((held, len(held) - 1))
        elif kind == "block_stored":
            for p in pages:
                generation[p] = generation.get(p, 0) + 1
                cached.add(p)
                for held, i in waiting.pop(p, []):
                    held[i] = content(p)
        else:
            for p in pages:
                cached.discard(p)
    start = requests[0][1]
    entries = []
    for rid, arrival, prompt, output in requests:
        full = prompt // page_size
        held = pages_of.get(rid, [])[:full]
        blocks = [b if b is not None else 0 for b in held]
        # hash ids must be >= 0; a page never stored (0) is made unique below
        entries.append(TraceEntry((arrival - start) / 1e9, prompt, max(1, output or 1), blocks))
    unique = next_id[0] + 1
    for e in entries:
        for i, b in enumerate(e.blocks):
            if b == 0:
                e.blocks[i] = unique
                unique += 1
    return ReplayTrace(f"{path.name}#run{run}", "db", page_size, entries)
