"""A watch recording of two and a half hours whose every event's misses are known,
for the tests of time windows: cycles of one hash at irregular times, so windows
cross second, minute and hour buckets at every offset.

A cycle of hash h starting at t: source 0 stores h (new); source 1 stores h (a
routing miss: 0 holds it); 0 removes h; 0 stores h again (recomputed after
eviction, and a routing miss: 1 holds it); a minute later 1 then 0 remove it.
Every store is new (prefill paid); the last is both misses at once. Both sources
announce blocks of ``BLOCK_SIZE`` tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_REMOVED, OP_STORED
from kvscope.profiler.watch.writer import WatchWriter

from support.watch_helpers import new_watch_run

S = 1_000_000_000
LENGTH_S = 9000
BLOCK_SIZE = 16
# (offset s, source, op, recomputed, routing miss)
CYCLE = (
    (0.0, 0, OP_STORED, 0, 0),
    (0.4, 1, OP_STORED, 0, 1),
    (1.3, 0, OP_REMOVED, 0, 0),
    (2.2, 0, OP_STORED, 1, 1),
    (61.5, 1, OP_REMOVED, 0, 0),
    (62.7, 0, OP_REMOVED, 0, 0),
)


@dataclass(frozen=True, slots=True)
class Event:
    t_s: float
    source: int
    op: int
    block: int
    recomputed: int
    routing: int


def build(path: Path) -> tuple[int, list[Event]]:
    """Write the recording to ``path``; its run id and its events."""
    rng = random.Random(23)
    events, t, block = [], 5.3, 1000
    while t + CYCLE[-1][0] < LENGTH_S:
        events += [Event(t + dt, src, op, block, rc, rm) for dt, src, op, rc, rm in CYCLE]
        t += CYCLE[-1][0] + 0.5 + rng.uniform(0, 150)
        block += 1
    db, run_id = new_watch_run(path)
    sources = [
        (i, "events", "vllm", f"tcp://r{i}:1", None, "", None, 0) for i in (0, 1)
    ]  # fmt: skip
    seqs = [0, 0]
    rows = []
    for e in events:
        rows.append((e.source, seqs[e.source], int(e.t_s * S), e.op, f"[{e.block}]", None,
                     "GPU", 0, 1))  # fmt: skip
        seqs[e.source] += 1
    # (*SOURCE_COUNTERS, source): the block size the sources' events announced
    counters = [(BLOCK_SIZE, seqs[i] - 1, *[0] * 9, None, i) for i in (0, 1)]
    writer = WatchWriter(db, run_id)
    for i in range(0, len(rows), 100):  # batches, as a recorder writes them
        first = i == 0
        writer.write(WatchBatch(sources=sources if first else [], blocks=rows[i : i + 100],
                                counters=counters if first else []))  # fmt: skip
    db.conn.close()
    return run_id, events


def expected(events: list[Event], lo: int, hi: int) -> dict[int, tuple[int, int, int, int]]:
    """Per source, (stored, removed, recomputed, routing misses) of the events in
    the whole seconds [lo, hi)."""
    out: dict[int, list[int]] = {}
    for e in events:
        if lo <= int(e.t_s) < hi:
            acc = out.setdefault(e.source, [0, 0, 0, 0])
            acc[0 if e.op == OP_STORED else 1] += 1
            acc[2] += e.recomputed
            acc[3] += e.routing
    return {src: tuple(v) for src, v in out.items()}


def expected_prefill(events: list[Event], lo: int, hi: int) -> dict[int, tuple[int, int]]:
    """Per source, (new blocks, both misses at once) of the events in the whole
    seconds [lo, hi): every store of a cycle is new, and the one that is both a
    recomputation and a routing miss is both."""
    out: dict[int, list[int]] = {}
    for e in events:
        if lo <= int(e.t_s) < hi and e.op == OP_STORED:
            acc = out.setdefault(e.source, [0, 0])
            acc[0] += 1
            acc[1] += e.recomputed and e.routing
    return {src: tuple(v) for src, v in out.items()}
