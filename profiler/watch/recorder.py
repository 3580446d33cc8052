"""Records a watched deployment into a kvscope database on a background thread.

The subscriber and the scraper only append to in-memory queues; a writer thread
wakes every ``flush_interval_s`` (or when ``flush_at`` batches wait), turns
them into rows and writes them in one transaction, with every source's
counters. The queue is bounded: when it is full the subscriber waits, ZMQ
drops at its high-water mark and the drop returns as a sequence gap, so memory
stays bounded and nothing is lost without being counted.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from kvscope.db.schema import COMPLETE, FAILED
from kvscope.db.store import open_db
from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import (
    EVENTS_SOURCE,
    LAG_METRIC,
    METRICS_SOURCE,
    OP_RESET,
    PRESSURE_SOURCE,
    QUEUE_METRIC,
    WATCH_KIND,
)
from kvscope.db.writer import create_run
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import now_ns
from kvscope.profiler.hardware import describe_versions
from kvscope.profiler.watch.incident import IncidentNote
from kvscope.profiler.watch.prom_text import parse_labels
from kvscope.profiler.watch.resume import Resumed, continue_run, resumable_run
from kvscope.profiler.watch.rows import SourceAttrs, batch_rows
from kvscope.profiler.watch.subscriber import Stream
from kvscope.profiler.watch.wire import EventBatch
from kvscope.profiler.watch.writer import WatchWriter
from kvscope.profiler.watch.writer_process import WriterProcess

log = logging.getLogger(__name__)
TRIM_EVERY_S = 60.0
EAGER_FLUSH = 64  # batches: with a writer process, a chunk goes once this many wait


class WatchRecorder:
    """Creates a run of kind 'watch'; ``start()``, feed it, ``finish(status)``."""

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        config: Mapping[str, Any],
        model: str | None = None,
        *,
        flush_interval_s: float = 0.25,
        flush_at: int = 2000,
        max_pending: int = 20_000,
        keep_raw_s: float | None = None,
        resume: bool = True,
        freeze_gc: bool = False,
        writer_process: bool | None = None,
    ) -> None:
        self._db = open_db(db_path)
        previous = resumable_run(self._db, config) if resume else None
        if previous is None:
            self.start_ns = now_ns()
            self.started_at = time.time()
            self.run_id = create_run(
                self._db,
                kind=WATCH_KIND,
                model=model,
                config=config,
                hardware={},
                versions=describe_versions(),
                started_at=self.started_at,
                start_ns=self.start_ns,
            )
            previous = Resumed(self.run_id, self.started_at, self.start_ns)
        else:
            # The same sources watched before into this file: continue that run, so its
            # sequence numbers, cache state and totals carry on (gaps replayed or lost).
            previous = continue_run(self._db, previous)
            self.run_id, self.started_at, self.start_ns = (
                previous.run_id, previous.started_at, previous.start_ns,
            )  # fmt: skip
        self.resumed = previous.written is not None
        # Stored sources of a resumed run: (endpoint, topic, dp_rank) -> their row
        self._stored = previous.stored
        self._stored_metrics = previous.stored_metrics  # URL -> source
        first_index = previous.first_index
        written = previous.written
        # A watching process of its own (kvscope watch: freeze_gc) writes from a child
        # process, so that SQLite and the aggregates no longer share its GIL with the
        # decoding (profiler.watch.writer_process); tests write from a thread.
        if writer_process is None:
            writer_process = freeze_gc
        self._writer: WatchWriter | WriterProcess
        if writer_process:
            try:
                self._writer = WriterProcess(
                    db_path, self.run_id, rows_written=written or 0, freeze_gc=freeze_gc
                )
            except BaseException:
                # Nothing will write this run: it ended before it began.
                self._db.execute(
                    "UPDATE runs SET status = ?, ended_at = ? WHERE id = ?",
                    (FAILED, time.time(), self.run_id),
                )
                self._db.conn.commit()
                self._db.conn.close()
                raise
        else:
            self._writer = WatchWriter(self._db, self.run_id)
            self._writer.rows_written = written or 0
        self._indexes = itertools.count(first_index)
        self._streams: dict[int, Stream] = {}
        self._attrs: dict[int, SourceAttrs] = {}
        # Each source's attributes as JSON, with what they were made from (see _counters)
        self._attrs_json: dict[int, tuple[SourceAttrs, tuple, str]] = {}
        self._new_sources: deque[tuple] = deque()
        # (source, seq, batch); a float instead of a batch marks a restart at that
        # engine time, kept in order with the batches
        self._batches: deque[tuple[int, int | None, EventBatch | float]] = deque()
        self._incidents: deque[tuple] = deque()
        self._metrics: deque[list[tuple]] = deque()
        self._flush_interval_s = flush_interval_s
        self._flush_at = flush_at
        # With a writer process, a chunk goes as soon as EAGER_FLUSH batches wait, not
        # flush_at: the send blocks while the child writes the last one, so chunks grow
        # to what came meanwhile, and a burst's first and last batches do not wait for
        # a full chunk (each had left the child idle for one: ~20% of a 1 s burst).
        self._wake_at = min(EAGER_FLUSH, flush_at) if writer_process else flush_at
        # With a writer process, a chunk is at most twice the last one (and at least
        # EAGER_FLUSH batches): the first of a burst goes with what is queued at once,
        # so the child starts writing it while the next, twice as large, is made,
        # instead of waiting idle for all that came meanwhile (a 1.2M-event burst's
        # first write began ~65 ms in, now ~15 ms); a backlog still goes in full chunks.
        self._writer_process = bool(writer_process)
        self._chunk_cap = EAGER_FLUSH if writer_process else flush_at
        self._max_pending = max_pending
        self._wake = threading.Event()
        self._room = threading.Event()
        self._room.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False
        self._model = model
        self._model_pending = False
        self.dropped_rows = 0
        self.error: Exception | None = None
        self.last_bad_message: str | None = None
        # In a process of its own (kvscope watch), the aggregates' millions of
        # long-lived lists are moved out of the collector's reach after each write:
        # full collections over them cost a third of the recording rate. Not in a
        # shared process (tests), where it would keep others' garbage forever.
        self._freeze_gc = freeze_gc
        if freeze_gc:
            # The same process's young collections: every 700 new lists (a block's
            # shelf entry and tree node are two) cost prefill-like folding ~20%;
            # every 10,000 they cost little, and only cycles wait longer. With a
            # writer process this one folds nothing: what it makes (the queue's
            # batches, a flush's rows and hash lists) is acyclic and gone within a
            # flush or two, and a young generation larger than a one-hash flush's
            # (~130,000 objects) lets it go before a collection looks at it: at
            # 10,000 the collections cost this process ~15% of its CPU (issue 23).
            gc.set_threshold(500_000 if writer_process else 10_000, 10, 10)
        # --keep-raw: raw rows older than this are deleted once a minute (the
        # aggregates stay), so a week-long watch's file stays bounded.
        self._keep_raw_ns = None if keep_raw_s is None else int(keep_raw_s * 1e9)
        self._trimmed_at = time.monotonic()
        self.raw_rows_trimmed = 0
        self._pressure_shown: tuple | None = None

    def ts_ns(self, engine_ts: float) -> int:
        """An engine's wall-clock timestamp on this run's clock (``start_ns`` origin)."""
        return self.start_ns + int((engine_ts - self.started_at) * 1e9)

    def clock_ns(self) -> int:
        """Now on the run's clock: by the wall clock, so a resumed run (begun by
        another process, whose monotonic clock this one does not share) stays on it."""
        return self.ts_ns(time.time())

    # --- the subscriber's and scraper's side ---------------------------------------

    def next_source_index(self) -> int:
        return next(self._indexes)

    def source_index(self, spec: Any, dp_rank: int | None, topic: str) -> int:
        """A stream's source number: a resumed run's own for a source it had."""
        stored = self._stored.get((spec.endpoint, topic or "", dp_rank))
        return self.next_source_index() if stored is None else stored["source"]

    def new_stream(self, stream: Stream) -> None:
        spec = stream.spec
        self._streams[stream.index] = stream
        attrs = self._attrs[stream.index] = SourceAttrs()
        stored = self._stored.pop((spec.endpoint, stream.topic or "", stream.dp_rank), None)
        if stored is not None:
            # Carry on from where the last watch stopped: the next batch after its
            # last sequence number is "next", anything beyond is a gap to replay.
            stream.tracker.last = stored["last_seq"]
            for name in ("batches", "events", "gaps", "recovered_batches", "lost_batches",
                         "restarts", "disconnects", "bad_messages"):  # fmt: skip
                setattr(stream, name, stored[name] or 0)
            attrs.block_size = stored["block_size"]
            attrs.block_events = stored["block_events"] or 0
            self.add_incident(stream.index, IncidentNote(
                "resumed", stored["last_seq"], None,
                detail="watch started again: continuing after the last recorded batch",
            ))  # fmt: skip
            return
        self._new_sources.append(
            (
                stream.index,
                EVENTS_SOURCE,
                spec.engine,
                spec.endpoint,
                spec.replay,
                stream.topic,
                stream.dp_rank,
                int(spec.listen),
            )
        )

    def add_metrics_source(self, url: str, engine: str) -> int:
        """A /metrics endpoint's source number (a resumed run's own for its URLs)."""
        if url in self._stored_metrics:
            return self._stored_metrics.pop(url)
        index = self.next_source_index()
        self._new_sources.append((index, METRICS_SOURCE, engine, url, None, None, None, 0))
        return index

    def on_batch(self, stream: Stream, seq: int, batch: EventBatch) -> None:
        while len(self._batches) >= self._max_pending and not self._stop.is_set():
            self._room.clear()
            self._wake.set()
            self._room.wait(0.1)
        self._batches.append((stream.index, seq, batch))
        # Set once: setting a set Event still takes its lock and notifies (a backlog
        # had the subscriber do that for every batch); the writer thread flushes
        # until the queue is below flush_at after it wakes, whatever came meanwhile.
        if len(self._batches) >= self._wake_at and not self._wake.is_set():
            self._wake.set()

    def on_incident(self, stream: Stream, incident: IncidentNote) -> None:
        self.add_incident(stream.index, incident)

    def on_restart(self, stream: Stream, last_seq: int | None, seq: int, ts: float) -> None:
        self.add_incident(
            stream.index, IncidentNote("restart", last_seq, seq, detail="sequence went backwards")
        )
        self._batches.append((stream.index, None, ts))

    def add_incident(self, source: int, incident: IncidentNote) -> None:
        if incident.kind == "bad_message":
            self.last_bad_message = incident.detail or "undecodable"
        self._incidents.append(incident.row(source, self.clock_ns()))

    def on_samples(self, rows: list[tuple]) -> None:
        """One scrape's ``watch_metrics`` rows."""
        if self._model is None:
            # Every vLLM and SGLang metric carries the served model's name.
            names = (parse_labels(row[3]).get("model_name") for row in rows)
            self._model = next(filter(None, names), None)
            self._model_pending = self._model is not None
        self._metrics.append(rows)

    @property
    def queued(self) -> int:
        return len(self._batches)

    @property
    def lag_s(self) -> float:
        """How long the oldest batch waiting to be written has waited (by the
        engine's clock): what back-pressure looks like before anything is lost."""
        try:
            oldest = self._batches[0][2]
        except IndexError:
            return 0.0
        ts = oldest if isinstance(oldest, float) else oldest.ts
        return max(0.0, time.time() - ts)

    @property
    def block_events(self) -> int:
        """Block events converted to rows so far (stored and removed, one per hash)."""
        return sum(a.block_events for a in list(self._attrs.values()))

    @property
    def rows_written(self) -> int:
        return self._writer.rows_written

    # --- the writer thread -------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvscope-watch-rec", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            self.flush()
            # A backlog is written a chunk at a time: a writer process writes one while
            # the next is made (and the queue's depth shows what waits).
            while len(self._batches) >= self._wake_at and not self._stop.is_set():
                self.flush()

    def _take(self, queue: deque) -> list:
        return [queue.popleft() for _ in range(len(queue))]

    def flush(self) -> int:
        """Write what is queued now; returns the number of block and raw rows."""
        if self._writer_process:
            # A chunk is taken once the child has a free slot for it (its handover,
            # profiler.watch.handover): it is then all that came while the child wrote.
            self._writer.wait_for_room()
        batch = WatchBatch(
            sources=self._take(self._new_sources),
            incidents=self._take(self._incidents),
        )
        for rows in self._take(self._metrics):
            batch.metrics.extend(rows)
        if self._model_pending:
            batch.model, self._model_pending = self._model, False
        depth, lag = len(self._batches), self.lag_s
        pressure = (depth, round(lag, 1))
        if pressure != self._pressure_shown and (depth or self._pressure_shown):
            # Back-pressure for the dashboard, only when it changes (an idle watch
            # writes nothing, so its views have nothing new to draw).
            self._pressure_shown = pressure
            stamp = self.clock_ns()
            batch.metrics += [
                (PRESSURE_SOURCE, stamp, QUEUE_METRIC, "", float(depth)),
                (PRESSURE_SOURCE, stamp, LAG_METRIC, "", lag),
            ]
        queue = self._batches
        take = min(len(queue), self._flush_at, self._chunk_cap)
        pending = [queue.popleft() for _ in range(take)]
        if self._writer_process:
            self._chunk_cap = max(EAGER_FLUSH, 2 * take)
        self._room.set()
        ts_ns = self.ts_ns
        attrs = self._attrs
        batch.hash_lists = hash_lists = []
        for index, seq, events in pending:
            if isinstance(events, float):
                stamp = ts_ns(events) - 1  # just before the new engine's first batch
                batch.blocks.append((index, None, stamp, OP_RESET, None, None, None, None, 0))
                hash_lists.append(None)
            else:
                made = len(batch.blocks), len(batch.raw), len(hash_lists)
                try:
                    stamp = ts_ns(events.ts)
                    batch_rows(
                        index, seq, stamp, events, attrs[index], batch.blocks, batch.raw,
                        hash_lists,
                    )  # fmt: skip
                except Exception as exc:  # one engine's batch, not the end of the watch
                    # Decoding refuses what it knows to be bad; anything else that cannot
                    # be made into rows is one bad message of its source, not the end of
                    # this thread (and of every source's recording with it).
                    del batch.blocks[made[0] :], batch.raw[made[1] :], hash_lists[made[2] :]
                    self._bad_batch(index, seq, exc)
        # Let go of the batches before the handover: marshal keeps a table of every
        # object referenced more than once, as half the hashes are while their batch
        # lives (by its struct and by the row): that had doubled its time.
        pending.clear()
        batch.counters = [self._counters(stream) for stream in list(self._streams.values())]
        try:
            self._writer.write(batch, self.dropped_rows)
            if isinstance(self._writer, WriterProcess):
                self._child_news()
            elif self._freeze_gc:
                gc.freeze()
        except Exception as exc:  # a full disk must not kill the thread: count, log, go on
            self.dropped_rows += len(batch.blocks) + len(batch.raw)
            if self.error is None:
                log.warning("kvscope watch: write failed, rows dropped: %s", exc)
            self.error = exc
            return 0
        if self._keep_raw_ns is not None and time.monotonic() - self._trimmed_at >= TRIM_EVERY_S:
            self.trim_raw()
        return len(batch.blocks) + len(batch.raw)

    def _bad_batch(self, index: int, seq: int | None, exc: Exception) -> None:
        """A queued batch that could not be made into rows: counted as its source's bad
        message (its incident goes with the next flush)."""
        stream = self._streams.get(index)
        if stream is not None:
            stream.bad_messages += 1
        self.add_incident(
            index,
            IncidentNote("bad_message", seq, seq, detail=f"could not record the batch: {exc}"),
        )

    def _child_news(self) -> None:
        """What the writer process reported: rows it could not write, and why."""
        writer = self._writer
        assert isinstance(writer, WriterProcess)
        self.dropped_rows += writer.take_failed()
        if writer.error is not None and self.error is None:
            log.warning("kvscope watch: write failed, rows dropped: %s", writer.error)
            self.error = KvscopeError(writer.error)

    def trim_raw(self) -> None:
        """Delete raw rows past ``keep_raw_s`` now."""
        self._trimmed_at = time.monotonic()
        try:
            self.raw_rows_trimmed += self._writer.trim_raw(self.clock_ns() - self._keep_raw_ns)
        except Exception as exc:  # a busy or full disk: the next minute tries again
            log.warning("kvscope watch: trimming raw rows failed: %s", exc)

    def _attrs_text(self, index: int) -> str:
        """``SourceAttrs.as_json``, made again only when the attributes changed: every
        flush writes every source's counters (with a writer process, a flush every
        64 batches or so), and 64 sources' JSON had cost ~0.5 ms a flush. Its sets
        and dict only grow and its counter only counts, so their sizes tell."""
        attrs = self._attrs[index]
        sizes = (
            len(attrs.spec_kinds), len(attrs.lora_names), len(attrs.media), len(attrs.groups),
            len(attrs.sessions), len(attrs.cache_salts), len(attrs.localities),
            len(attrs.ownerships), attrs.extra_keys_events,
        )  # fmt: skip
        cached = self._attrs_json.get(index)
        if cached is None or cached[0] is not attrs or cached[1] != sizes:
            cached = self._attrs_json[index] = (attrs, sizes, attrs.as_json())
        return cached[2]

    def _counters(self, stream: Stream) -> tuple:
        attrs = self._attrs[stream.index]
        return (
            attrs.block_size,
            stream.tracker.last,
            stream.batches,
            stream.events,
            attrs.block_events,
            stream.gaps,
            stream.recovered_batches,
            stream.lost_batches,
            stream.restarts,
            stream.disconnects,
            stream.bad_messages,
            self._attrs_text(stream.index),
            stream.index,
        )

    def finish(self, status: str = COMPLETE) -> None:
        """Drain the queues, mark the run ``status`` and close the database."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        self._wake.set()
        self._room.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()
        while self._batches:
            self.flush()
        writer = self._writer
        if isinstance(writer, WriterProcess):
            writer.finish(status, self.dropped_rows)
            self.dropped_rows += writer.take_failed()
            if writer.error is not None and self.error is None:
                self.error = KvscopeError(writer.error)  # said once, by whoever stopped us
            if writer.error is not None:
                # The child died or failed: the run ended badly, whatever was asked, and
                # says so itself (the child may not have been able to).
                now = time.time()
                try:
                    self._db.execute(
                        "UPDATE runs SET status = ?, ended_at = ?, heartbeat = ?, "
                        "dropped_events = ? WHERE id = ?",
                        (FAILED, now, now, self.dropped_rows, self.run_id),
                    )
                    self._db.conn.commit()
                except sqlite3.Error as exc:
                    # What failed the child (a locked or full database) can fail this too:
                    # the run then stays 'running' with no live writer, which readers show
                    # as incomplete; the error the user sees is the child's.
                    log.debug("kvscope watch: marking run %s failed: %s", self.run_id, exc)
        else:
            writer.finish(status, self.dropped_rows)
        self._db.conn.close()
