"""A test-only probe of the engine's true page state, read after every step.

It reads the KV-cache manager and the radix tree directly (who holds which
device page, which pages the tree holds, what was evicted this step), never the
events, and checks that reading against the pool's own reference counts and
free list; the truth it keeps is what ``db.pages.step_pages`` must rebuild from
the recording, page by page (tests/test_page_truth.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvscope.db.page_replay import step_pages
from kvscope.db.page_states import StepPages, step_pages_from
from kvscope.db.source import connection
from kvscope.engine.engine import Engine
from kvscope.engine.events import EventBus
from kvscope.engine.tiny import VOCAB
from kvscope.profiler.recorder import Recorder


class PageProbe:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.truth: dict[int, StepPages] = {}

    def read(self) -> StepPages:
        """The state right after the step the engine just ran."""
        kv = self.engine.kv
        holds = {rid: list(kv.device_pages(req)) for rid, req in kv.holders.items()}
        prefix = kv.prefix
        tree = prefix.device_pages_held() if prefix is not None else np.zeros(0, np.int64)
        evicted = dict(getattr(prefix, "evicted_step", {}))
        if kv.infllm is not None:  # InfLLM's blocks moved to the host tier this step
            evicted.update(kv.infllm.offloaded_pages(kv.step))
        truth = step_pages_from(kv.step, kv.pool.num_pages, holds, tree, evicted)
        # The probe's own reading agrees with the pool's counts: one reference per
        # holder and one for the tree, and the free list is what nobody references.
        refcount = np.asarray(kv.pool.refcount, dtype=np.int64)
        assert np.array_equal(truth.holders + truth.in_tree, refcount), kv.step
        assert kv.pool.num_free == truth.counts().unused, kv.step
        self.truth[kv.step] = truth
        return truth


def drive_probed(
    engine: Engine, probe: PageProbe, arrivals: list[tuple[int, list[int], int]]
) -> None:
    """Add ``(step, prompt token ids, max tokens)`` requests at their steps and step the
    engine to the end, reading the probe after every step."""
    from kvscope.engine.sampler import SamplingParams

    pending = sorted(arrivals, key=lambda a: a[0])
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, n = pending.pop(0)
            engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
        if engine.has_unfinished():
            engine.step()
            probe.read()
        step += 1
        assert step < 20_000, "engine made no progress"


def mismatches(
    db: object, run_id: int, probe: PageProbe, reconstruct: Callable = step_pages
) -> list[str]:
    """Every way the recording's reconstruction differs from the probe, step by step."""
    wrong = []
    for step, truth in probe.truth.items():
        got = reconstruct(db, run_id, step)
        if got is None:
            wrong.append(f"step {step}: no reconstruction")
            continue
        for name in ("state", "holders", "holder", "in_tree"):
            a, b = getattr(got, name), getattr(truth, name)
            if len(a) != len(b) or not np.array_equal(a, b):
                bad = np.flatnonzero(a != b) if len(a) == len(b) else []
                page = int(bad[0]) if len(bad) else -1
                wrong.append(
                    f"step {step}: {name} differs on {len(bad)} pages (first {page}: "
                    f"recorded {a[page] if page >= 0 else len(a)}, engine "
                    f"{b[page] if page >= 0 else len(b)})"
                )
        mine = {r: sorted(p.tolist()) for r, p in got.request_pages.items()}
        theirs = {r: sorted(p.tolist()) for r, p in truth.request_pages.items()}
        if mine != theirs:
            wrong.append(f"step {step}: request page lists differ")
        wrong.extend(f"step {step}: {e}" for e in got.invariant_errors())
        # the step summary's figures (what the panels and charts plot) agree with the map
        with connection(db) as conn:
            row = conn.execute(
                """SELECT pages_total, pages_used, pages_cached, pages_free FROM steps
                   WHERE run_id = ? AND step = ?""",
                (run_id, step),
            ).fetchone()
        c = got.counts()
        if row is not None and row != (c.pool, c.used + c.cached, c.cached, c.unused):
            wrong.append(f"step {step}: step summary {row} != page states {c}")
        wrong.extend(f"step {step} (engine): {e}" for e in truth.invariant_errors())
    return wrong


def record_probed(path: Path, engine_for_bus, arrivals) -> tuple[int, PageProbe, dict[str, int]]:
    """Record the run ``engine_for_bus(bus)`` makes of ``arrivals`` into ``path``, probed
    after every step; returns (run id, probe, count of each event kind)."""
    bus = EventBus()
    kinds: dict[str, int] = {}
    bus.subscribe(lambda e: kinds.__setitem__(e.kind, kinds.get(e.kind, 0) + 1))
    engine = engine_for_bus(bus)
    recorder = Recorder(path, {"test": True}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    probe = PageProbe(engine)
    drive_probed(engine, probe, arrivals)
    recorder.finish("complete")
    return recorder.run_id, probe, kinds


def shared_prefix_arrivals(
    n: int, prefix_len: int = 24, seed: int = 0, every: int = 1, out: int = 8
):
    """``n`` arrivals (one every ``every`` steps) whose prompts share a ``prefix_len`` stem."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, VOCAB) for _ in range(prefix_len)]
    return [
        (i * every, prefix + [rng.randrange(1, VOCAB) for _ in range(3 + i % 5)], out)
        for i in range(n)
    ]
