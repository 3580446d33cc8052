"""Run many replay points (capacities x policies x page sizes) over the cores.

Points are independent replays of one trace, so they spread over worker
processes. Workers are forked after the trace and its page keys are built, so
they share them copy-on-write instead of each parsing and keying the trace
again. ``Session`` (optional) lets the caller attach each point to something
that needs the point's events (a recorder): its ``open(config)`` returns the bus
the driver emits on and a ``close(result, status)`` to call when the point ends.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from kvscope.engine.events import EventBus
from kvscope.engine.replay.config import ReplayConfig, ReplayResult, default_workers
from kvscope.engine.replay.driver import Prepared, ReplayDriver, prepare
from kvscope.engine.replay.traces import ReplayTrace


class Session(Protocol):
    def open(
        self, config: ReplayConfig
    ) -> tuple[EventBus, Callable[[ReplayResult | None, str], Any]]: ...


# What forked workers inherit (set just before the pool starts).
_STATE: dict[str, Any] = {}


def _stop_requested() -> None:
    stop = _STATE.get("stop")
    if stop is not None and stop.is_set():
        raise KeyboardInterrupt


def _ignore_sigint() -> None:
    # Workers stop when the parent says so (a Ctrl-C reaches the whole process group),
    # at a step boundary, so each marks its run interrupted instead of dying mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_point(index: int) -> tuple[int, ReplayResult | None, Any]:
    trace: ReplayTrace = _STATE["trace"]
    config: ReplayConfig = _STATE["configs"][index]
    prepared: Prepared = _STATE["prepared"][config.page_size]
    session: Session | None = _STATE["session"]
    in_worker = _STATE.get("stop") is not None
    if in_worker and _STATE["stop"].is_set():
        return index, None, None  # never started: nothing recorded
    bus, close = (None, None) if session is None else session.open(config)
    driver = ReplayDriver(trace, config, bus=bus, prepared=prepared)
    try:
        result = driver.run(throttle=_stop_requested if in_worker else None)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        if close is not None:
            close(driver.result(), "interrupted" if interrupted else "failed")
        if interrupted and in_worker:
            return index, None, None
        raise
    extra = close(result, "complete") if close is not None else None
    return index, result, extra


def run_sweep(
    trace: ReplayTrace,
    configs: Sequence[ReplayConfig],
    workers: int | None = None,
    session: Session | None = None,
    progress: Callable[[int, int, ReplayConfig, ReplayResult], None] | None = None,
) -> list[tuple[ReplayResult, Any]]:
    """Every point's result (and whatever its session's ``close`` returned), in input order."""
    prepared: dict[int, Prepared] = {}
    for ps in sorted({c.page_size for c in configs}):
        belady = any(c.eviction_policy == "belady" for c in configs if c.page_size == ps)
        prepared[ps] = prepare(trace, ps, belady)
    _STATE.update(trace=trace, configs=list(configs), prepared=prepared, session=session)
    workers = min(workers or default_workers(), len(configs))
    out: list[tuple[ReplayResult, Any] | None] = [None] * len(configs)
    try:
        if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            results = map(_run_point, range(len(configs)))
            pool = None
        else:
            ctx = multiprocessing.get_context("fork")
            _STATE["stop"] = ctx.Event()
            pool = ctx.Pool(workers, initializer=_ignore_sigint)
            # Longest points first (unlimited and large capacities evict least but hold most).
            order = sorted(
                range(len(configs)), key=lambda i: -(configs[i].capacity_tokens or 1 << 62)
            )
            results = pool.imap_unordered(_run_point, order)
        try:
            for done, (index, result, extra) in enumerate(results, start=1):
                if result is None:
                    continue
                out[index] = (result, extra)
                if progress is not None:
                    progress(done, len(configs), configs[index], result)
        except KeyboardInterrupt:
            if pool is not None:
                # Tell the workers, and let them mark their runs interrupted (a second
                # Ctrl-C gives up waiting).
                _STATE["stop"].set()
                pool.close()
                try:
                    pool.join()
                except KeyboardInterrupt:
                    pass
            raise
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    finally:
        _STATE.clear()
    return [o for o in out if o is not None]


def sweep_configs(
    base: ReplayConfig,
    capacities: Sequence[int | None],
    policies: Sequence[str],
    page_sizes: Sequence[int],
) -> list[ReplayConfig]:
    return [
        replace(base, capacity_tokens=c, eviction_policy=p, page_size=ps)
        for ps in page_sizes
        for p in policies
        for c in capacities
    ]
