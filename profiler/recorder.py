"""Records a run's events to SQLite without ever making the engine wait on disk.

``Recorder.on_event`` (an EventBus subscriber) only appends to a bounded queue;
a background thread wakes every ``flush_interval_s`` (or as soon as
``flush_at`` events are queued), turns the queued events into table rows and
writes them in one transaction. Events that do not fit in the queue, or whose
batch fails to write, are counted in ``dropped_events`` and stored with the run,
never lost silently. A SIGKILL loses at most the events since the last flush.

The queue is bounded twice: by events (``max_queue``: seconds of a stalled
disk at GPU step rates) and by the bytes of queued page maps
(``max_queue_bytes``: at 100,000 pages one map is 400 kB, so a count alone
would let a stalled writer hold gigabytes). bench/recorder_rate.py measures
that the writer keeps up, with no drops, at 1,000 steps/s and 100k pages.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from types import TracebackType
from typing import Any

import numpy as np

from kvscope.db.formulas import RunSummary
from kvscope.db.queries import run_summary
from kvscope.db.schema import (
    COMPLETE,
    FAILED,
    GPU_COLUMNS,
    INTERRUPTED,
    KERNEL_COLUMNS,
    STEP_COLUMNS,
)
from kvscope.db.store import open_db
from kvscope.db.writer import Batch, EventShape, Writer, create_run
from kvscope.engine.events import (
    PAGE_CACHED,
    PAGE_EVICTED,
    PAGE_FREE,
    Event,
    FirstToken,
    GpuSample,
    KernelTiming,
    PageMap,
    RequestArrived,
    RequestFinished,
    RequestPreempted,
    RequestRejected,
    RequestScheduled,
    StepSummary,
    now_ns,
)
from kvscope.profiler.hardware import describe_hardware, describe_versions

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in an event payload")


# One shared encoder: json.dumps with options builds a new encoder per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=_jsonable).encode

Converter = Callable[[list[Event], Batch], None]


def _typed(table: str, columns: tuple[str, ...]) -> Converter:
    get = attrgetter(*columns)

    def convert(events: list[Event], batch: Batch) -> None:
        getattr(batch, table).extend(map(get, events))

    return convert


# zlib releases the GIL, so large page maps compress in parallel, off the engine's thread:
# at 100k pages one map takes ~3 ms to compress, and a GPU engine may take one every few
# ms. Small maps compress inline (a worker hand-off costs more than compressing them).
_PARALLEL_MAP_BYTES = 1 << 16
_compressor = ThreadPoolExecutor(
    max_workers=max(1, min(4, (os.cpu_count() or 2) - 1)), thread_name_prefix="kvscope-zlib"
)


def _compress(owners: np.ndarray) -> bytes:
    return zlib.compress(owners, 1)


def _optional_blob(array: np.ndarray | None) -> bytes | None:
    return None if array is None else _compress(np.ascontiguousarray(array, dtype="<i4"))


def _page_map_rows(events: list[Event], batch: Batch) -> None:
    arrays = [np.ascontiguousarray(event.owners, dtype="<i4") for event in events]
    parallel = len(arrays) > 1 and arrays[0].nbytes >= _PARALLEL_MAP_BYTES
    blobs = (_compressor.map if parallel else map)(_compress, arrays)
    for event, owners, blob in zip(events, arrays, blobs, strict=True):
        holds, tree = _optional_blob(event.holds), _optional_blob(event.tree)
        batch.page_maps.append(
            (
                event.ts_ns,
                event.step,
                len(owners),
                int(np.count_nonzero(owners >= 0)),
                int(np.count_nonzero(owners == PAGE_CACHED)),
                int(np.count_nonzero(owners == PAGE_FREE)),
                int(np.count_nonzero(owners == PAGE_EVICTED)),
                blob,
                holds,
                tree,
            )
        )


# Lifecycle events also update the requests table: (Batch list, row builder).
_REQUEST_UPDATES: dict[type[Event], tuple[str, Callable[[Any], tuple]]] = {
    RequestArrived: (
        "arrivals",
        attrgetter("request_id", "ts_ns", "prompt_tokens", "max_tokens"),
    ),
    RequestRejected: ("rejections", attrgetter("request_id", "reason")),
    RequestScheduled: ("schedules", attrgetter("request_id", "ts_ns", "cached_tokens")),
    FirstToken: ("first_tokens", attrgetter("request_id", "ts_ns", "ttft_s")),
    RequestPreempted: ("preemptions", lambda event: (event.request_id,)),
    RequestFinished: (
        "finishes",
        attrgetter(
            "request_id",
            "ts_ns",
            "prompt_tokens",
            "output_tokens",
            "cached_tokens",
            "finish_reason",
            "ttft_s",
            "tpot_s",
        ),
    ),
}


def _generic(cls: type[Event]) -> Converter:
    """Rows of the events table: the event's own fields, which SQLite turns into a
    JSON payload; tuple and array fields travel as JSON text."""
    own = [f for f in dataclasses.fields(cls) if f.name not in ("ts_ns", "step")]
    shape = EventShape(
        cls.kind,
        tuple(f.name for f in own),
        frozenset(f.name for f in own if "tuple" in str(f.type) or "ndarray" in str(f.type)),
    )
    get = attrgetter("ts_ns", "step", *shape.fields)
    json_positions = [i for i, name in enumerate(shape.fields, 2) if name in shape.json_fields]
    update = _REQUEST_UPDATES.get(cls)

    def convert(events: list[Event], batch: Batch) -> None:
        rows = batch.events.setdefault(shape, [])
        if json_positions:
            for event in events:
                values = list(get(event))
                for i in json_positions:
                    values[i] = _encode(values[i])
                rows.append(values)
        else:
            rows.extend(map(get, events))
        if update is not None:
            getattr(batch, update[0]).extend(map(update[1], events))

    return convert


_TYPED: dict[type[Event], Converter] = {
    StepSummary: _typed("steps", STEP_COLUMNS),
    KernelTiming: _typed("kernels", KERNEL_COLUMNS),
    GpuSample: _typed("gpu_samples", GPU_COLUMNS),
    PageMap: _page_map_rows,
}


class _Converters(dict[type[Event], Converter]):
    """Converter per event class, built on first sight (so new event kinds just work)."""

    def __missing__(self, cls: type[Event]) -> Converter:
        self[cls] = converter = _TYPED.get(cls) or _generic(cls)
        return converter


_CONVERTERS = _Converters()


def to_batch(events: list[Event]) -> Batch:
    """Table rows for a list of events (grouped by class, so each group converts in one pass)."""
    groups: dict[type[Event], list[Event]] = {}
    for event in events:
        group = groups.get(type(event))
        if group is None:
            groups[type(event)] = group = []
        group.append(event)
    batch = Batch()
    for cls, group in groups.items():
        _CONVERTERS[cls](group, batch)
    return batch


class Recorder:
    """Subscribe ``on_event`` to an EventBus, ``start()``, and ``finish()`` at the end.

    Creates the run row (status 'running') at construction; raises KvscopeError
    if ``db_path`` cannot be used. Unsubscribe from the bus before ``finish``:
    events arriving after it are not recorded.
    """

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        run_config: Mapping[str, Any],
        model: str | None,
        kind: str = "engine",
        *,
        hardware: Mapping[str, Any] | None = None,
        versions: Mapping[str, Any] | None = None,
        flush_interval_s: float = 0.25,
        flush_at: int = 5000,
        max_queue: int = 200_000,
        max_queue_bytes: int = 512 << 20,
    ) -> None:
        self._db = open_db(db_path)
        self.start_ns = now_ns()
        self.started_at = time.time()
        self.run_id = create_run(
            self._db,
            kind=kind,
            model=model,
            config=run_config,
            hardware=describe_hardware() if hardware is None else hardware,
            versions=describe_versions() if versions is None else versions,
            started_at=self.started_at,
            start_ns=self.start_ns,
        )
        self._writer = Writer(self._db, self.run_id)
        self._queue: deque[Event] = deque()
        self._max_queue = max_queue
        self._max_queue_bytes = max_queue_bytes
        self._queued_bytes = 0  # page-map arrays in the queue (under _drop_lock)
        self._flush_at = flush_at
        self._flush_interval_s = flush_interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._drop_lock = threading.Lock()
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self.error: Exception | None = None  # the last failed write, if any
        self.summary: RunSummary | None = None

    # --- the engine's side: cheap, never blocks ----------------------------------

    def on_event(self, event: Event) -> None:
        queue = self._queue
        if len(queue) >= self._max_queue:
            self._count_dropped(1)
            return
        if type(event) is PageMap and not self._reserve(event.owners.nbytes):
            return
        queue.append(event)
        if len(queue) >= self._flush_at and not self._wake.is_set():
            self._wake.set()

    def _reserve(self, nbytes: int) -> bool:
        """Room for a page map's array in the queue? Counts it as dropped if not."""
        with self._drop_lock:
            if self._queued_bytes + nbytes > self._max_queue_bytes:
                self._dropped += 1
                return False
            self._queued_bytes += nbytes
            return True

    def _count_dropped(self, n: int) -> None:
        with self._drop_lock:  # the GPU sampler emits from its own thread
            self._dropped += n

    @property
    def dropped_events(self) -> int:
        """Events that never reached the database (queue full, or a failed write)."""
        return self._dropped

    @property
    def queued(self) -> int:
        """Events waiting for the writer thread."""
        return len(self._queue)

    @property
    def events_written(self) -> int:
        """Events committed to the database so far."""
        return self._writer.events_written

    # --- the writer thread ----------------------------------------------------------

    def start(self) -> None:
        """Start the background writer thread."""
        if self._thread is not None:
            raise RuntimeError("recorder already started")
        self._thread = threading.Thread(target=self._run, name="kvscope-recorder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            self.flush()

    def flush(self) -> int:
        """Write what is queued now (the writer thread calls this; so may finish). Returns the count."""
        queue = self._queue
        events = [queue.popleft() for _ in range(len(queue))]
        taken = sum(e.owners.nbytes for e in events if type(e) is PageMap)
        with self._drop_lock:
            self._queued_bytes -= taken
        try:
            self._writer.write(to_batch(events), self._dropped)
        except Exception as exc:  # a full disk must not kill the thread: count, log, go on
            self._count_dropped(len(events))
            if self.error is None:
                log.warning("kvscope recorder: write failed, events dropped: %s", exc)
            self.error = exc
            return 0
        return len(events)

    # --- the end ------------------------------------------------------------------------

    def finish(self, status: str = COMPLETE) -> RunSummary:
        """Drain the queue, mark the run ``status`` (complete, interrupted or failed),
        store its summary figures and close the database. Returns the summary."""
        if self.summary is not None:
            return self.summary  # already finished (e.g. explicitly, then by __exit__)
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join()
        self._max_queue = 0  # late events are counted as dropped, not kept in memory
        self.flush()
        summary = dataclasses.replace(run_summary(self._db, self.run_id), status=status)
        self._writer.finish(status, summary, self._dropped)
        self._db.conn.close()
        self.summary = summary
        return summary

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            status = COMPLETE
        elif issubclass(exc_type, KeyboardInterrupt):
            status = INTERRUPTED
        else:
            status = FAILED
        self.finish(status)
