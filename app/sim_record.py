"""Store ``kvscope simulate`` results in a kvscope database, one run per allocator.

Each allocator becomes a run of kind ``simulation`` whose steps are the
simulator's timeline expressed as step summaries (one "page" = one token slot
for the non-paged allocators), so the TUI, the dashboard and ``kvscope
runs``/``report`` show a simulation beside real engine runs. The last step
also gets a page map (who holds which page then, from the allocator's layout),
so a finished simulation shows its last map; steps before it have none.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kvscope.db.store import open_db
from kvscope.engine.alloc_sim.replay import SimResult
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import PAGE_FREE, PageMap, StepSummary, encode_holds
from kvscope.profiler.recorder import Recorder


def check_database(db_path: str | os.PathLike[str]) -> None:
    """Refuse a database that cannot be recorded into before the simulation runs: a
    directory, a text file or a missing directory had been found only after it (a
    minute for 10^5 requests, and its --plot already written). A file that does not
    exist yet is not created here, so a simulation that fails leaves none behind."""
    path = Path(db_path)
    if path.exists():
        open_db(path).conn.close()
        return
    parent = path.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise KvscopeError(
            f"cannot open database {path}: its directory {parent} does not exist or is not writable"
        )


# Steps between writes: the recorder is not started here (no writer thread), and its
# queue holds at most 200,000 events; past that it drops them, and a long simulation's
# run had lost most of its steps and its last page map (614,261 of 814,260 at 20,000
# requests), said only in the runs table's DROPPED column.
WRITE_EVERY = 5000


def record_simulation(
    db_path: str, results: dict[str, SimResult], config: dict, step_s: float, page_size: int
) -> list[int]:
    """Write every allocator's timeline; returns the new run ids."""
    run_ids = []
    for name, result in results.items():
        unit = page_size if name == "paged" else 1
        recorder = Recorder(
            db_path,
            {**config, "allocator": name, **result.summary()},
            model=None,
            kind="simulation",
        )
        t = result.timeline
        for step, (held, reserved, running, waiting) in enumerate(
            zip(t.held, t.reserved, t.running, t.waiting, strict=True)
        ):
            pages_total = result.capacity_slots // unit
            pages_used = -(-reserved // unit)
            recorder.on_event(
                StepSummary(
                    recorder.start_ns + int(step * step_s * 1e9), step,
                    batch_size=running, prefill_tokens=0, decode_tokens=running, running=running, waiting=waiting,
                    pages_total=pages_total, pages_used=pages_used, pages_cached=0, pages_free=pages_total - pages_used,
                    page_size=unit, tokens_held=held, host_pages_used=0, duration_s=step_s,
                )
            )  # fmt: skip
            if recorder.queued >= WRITE_EVERY:
                recorder.flush()
        if t.held:
            recorder.on_event(
                last_page_map(
                    result, unit, recorder.start_ns + int((len(t.held) - 1) * step_s * 1e9)
                )
            )
        recorder.finish("complete")
        run_ids.append(recorder.run_id)
    return run_ids


def last_page_map(result: SimResult, unit: int, ts_ns: int) -> PageMap:
    """The allocator's layout at the last step as a page map: one page per ``unit``
    slots, each held by the request whose block covers it (no prefix tree)."""
    num_pages = result.capacity_slots // unit
    owners = np.full(num_pages, PAGE_FREE, dtype=np.int32)
    holds: dict[int, list[int]] = {}
    for rid, start, length in result.timeline.last_extents:
        pages = list(range(start // unit, -(-(start + length) // unit)))
        owners[pages] = rid
        holds.setdefault(rid, []).extend(pages)
    return PageMap(
        ts_ns,
        len(result.timeline.held) - 1,
        owners,
        holds=encode_holds(holds),
        tree=np.zeros(0, np.int32),
    )
