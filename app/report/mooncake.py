"""A recorded kvscope run as a Mooncake-format trace, to replay at other capacities.

One JSON line per request, in arrival order: ``timestamp`` (ms since the first
arrival), ``input_length``, ``output_length`` and ``hash_ids``, one id per
page of the prompt, as the Mooncake FAST'25 traces give them. The ids are the
page-level content ids ``app.replay_db.trace_from_run`` derives from the run's
page events (equal prefix pages, equal ids); the partial last page of a prompt
(never shared: only full pages are) gets an id of its own, so a line has
ceil(input_length / page size) ids as the format expects. The block size is the
run's page size: replay the file with ``--block-size`` set to it (the command
prints it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from kvscope.app.replay_db import trace_from_run
from kvscope.engine.replay.traces import ReplayTrace


def mooncake_records(trace: ReplayTrace) -> Iterator[dict]:
    """The trace's requests as Mooncake records (partial last pages get fresh ids)."""
    ps = trace.block_size
    fresh = 1 + max((b for e in trace.entries for b in e.blocks or ()), default=0)
    for e in trace.entries:
        ids = list(e.blocks or ())
        while len(ids) < -(-e.input_len // ps):
            ids.append(fresh)
            fresh += 1
        yield {
            "timestamp": round(e.arrival_s * 1000),
            "input_length": e.input_len,
            "output_length": e.output_len,
            "hash_ids": ids,
        }


def write_mooncake(db: str | Path, run_id: int, out: Path) -> int:
    """Write run ``run_id`` of ``db`` to ``out`` as Mooncake JSONL; returns its block size."""
    trace = trace_from_run(Path(db), run_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for record in mooncake_records(trace):
            f.write(json.dumps(record) + "\n")
    return trace.block_size


__all__ = ["mooncake_records", "write_mooncake"]
