"""The watch's SQLite writer and aggregates in a process of their own.

Decoding the streams and folding them into the aggregates (``profiler.watch.fold``)
are both Python work: in one process they share one GIL, and the writer's share
(rows, SQLite inserts, folding) had held ``kvscope watch`` to a fraction of what
two cores can take (issue 23). Here the watching process keeps the sockets,
the sequence tracking and the rows, and hands each flush's ``WatchBatch`` to a
child process that owns ``WatchWriter``: the next batch is built while the
last one is written, and a batch waits in the watching process's queue (where
its depth and lag are shown) while the child is busy. A large batch (a chunk of
a backlog, megabytes) goes through one of two shared-memory slots
(``profiler.watch.handover``) and the pipe carries only its place; a small one
goes through the pipe.

The child ignores SIGINT and SIGTERM (Ctrl-C, and a supervisor's stop, reach
the whole process group): the watching process stops it with a last write and
``finish``. If the watching process dies,
the child sees its pipe close and marks the run failed, so the file is left
readable and resumable; if the child dies, the watching process counts what it
could not hand over as dropped and says why (``error``). Every transaction the
child commits holds raw rows and their aggregates together, so a crash loses
the batches in flight, never the consistency of what is on disk; and nothing is
lost uncounted: the watching process keeps the rows it handed over that the
child has not yet answered for (written or failed), and counts those as dropped
when the child dies. If the child's own last write fails (a full disk, a locked
database), it exits non-zero and the watching process marks the run failed and
says why; the child prints its ``kvscope: error:`` line itself only when the
watching process is gone.
"""

from __future__ import annotations

import gc
import marshal
import multiprocessing as mp
import os
import signal
import sys
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from kvscope.db.schema import FAILED
from kvscope.db.watch_batch import WatchBatch
from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.handover import INLINE_MAX, SlotReader, SlotWriter

FINISH_TIMEOUT_S = 600.0  # the last batch and the final persist
_BATCH_FIELDS = tuple(WatchBatch.__dataclass_fields__)


class WriterProcess:
    """``WatchWriter``'s interface, served by a child process."""

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        run_id: int,
        *,
        rows_written: int = 0,
        freeze_gc: bool = False,
    ) -> None:
        self.run_id = run_id
        self.rows_written = rows_written
        self.failed_rows = 0  # rows the child could not write (or never got): dropped
        self.trimmed_rows = 0
        self.error: str | None = None  # why the child failed a write, or died
        # time.perf_counter() (system-wide on Linux) of the child's last commit, as read
        self.committed_at: float | None = None
        # Rows handed over that the child has not answered for: lost if it dies.
        self._unanswered = 0
        self._fatal = False  # the child said why it stops: its death adds nothing
        self._finished = False  # the child said it finished: its pipe's end is no news
        self._slots = SlotWriter()
        # The slot (None: the pipe) of each write the child has not answered for, oldest
        # first: it answers them in order, and a slot is reused only once answered.
        self._inflight: deque[int | None] = deque()
        ctx = mp.get_context("spawn")  # never fork: an SQLite connection must not cross it
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(os.fspath(db_path), run_id, rows_written, freeze_gc, child),
            name="kvscope-watch-writer",
            daemon=True,
        )
        self._proc.start()
        child.close()
        # Spawning and imports take a second or so; a resumed run's rebuild from its raw
        # rows takes as long as its length: no time limit, only the child's life.
        while not self._pipe.poll(0.5) and self._proc.is_alive():
            pass
        try:
            kind, detail = self._pipe.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            kind, detail = "error", f"exit status {self._proc.exitcode}"
        if kind != "ready":
            self._proc.join(5)
            raise KvscopeError(f"the watch's writer process failed: {detail}")

    def _collect(self, wait_s: float = 0.0) -> Any:
        """Read the child's answers so far (waiting up to ``wait_s`` for the first);
        returns the last one, or None."""
        last = None
        if self._finished:
            return None
        try:
            while self._pipe.poll(wait_s):
                wait_s = 0.0
                answer = self._pipe.recv()
                last = answer
                kind = answer[0]
                if kind == "written":
                    self._answered()
                    self.rows_written = answer[1]
                    self._unanswered -= answer[2]
                    self.committed_at = answer[3]
                elif kind == "failed":
                    self._answered()
                    self._unanswered -= answer[1]
                    self.failed_rows += answer[1]
                    self.error = answer[2]
                elif kind == "fatal":
                    self.error = answer[1]
                    self._fatal = True
                elif kind == "trimmed":
                    self.trimmed_rows += answer[1]
                elif kind == "finished":
                    self.rows_written = answer[1]
                    self._finished = True
                    break
        except (EOFError, OSError):
            self._died()
        return last

    def _died(self) -> None:
        """The child is gone (its answers all read): what it never answered for is lost."""
        self._proc.join(1.0)
        if not self._fatal and (self.error is None or self._proc.exitcode is not None):
            self.error = f"the watch's writer process died (exit status {self._proc.exitcode})"
        self.failed_rows += self._unanswered
        self._unanswered = 0
        self._inflight.clear()

    def _answered(self) -> None:
        if self._inflight:
            self._inflight.popleft()

    def _gone(self, rows: int) -> bool:
        """A send found the child dead: read what it answered before, count the rest."""
        self._collect()  # up to the pipe's end, which calls _died
        self._died()  # (again: idempotent) if its answers had all been read already
        self.failed_rows += rows
        return False

    def _send(self, message: tuple | bytes, rows: int = 0) -> bool:
        if self._proc.exitcode is not None:
            return self._gone(rows)
        try:
            # marshal, not pickle: plain tuples, lists, ints and strings, dumped in a
            # quarter of pickle's time (a one-hash chunk is 64,000 rows and as many
            # hash lists), by the same interpreter that loads them.
            data = message if message.__class__ is bytes else marshal.dumps(message)
            self._pipe.send_bytes(data)
        except (BrokenPipeError, EOFError, OSError):
            return self._gone(rows)
        self._unanswered += rows
        return True

    def write(self, batch: WatchBatch, dropped_rows: int = 0) -> None:
        """Hand ``batch`` over: a large one through a shared-memory slot
        (``profiler.watch.handover``), which returns once a slot is free (both full:
        the child is writing one and the other waits for it; the back-pressure the
        recorder's queue shows), a small one through the pipe."""
        self._collect()
        fields = tuple(getattr(batch, name) for name in _BATCH_FIELDS)
        rows = len(batch.blocks) + len(batch.raw)
        data = marshal.dumps(("write", fields, dropped_rows))
        slot = self.wait_for_room() if len(data) > INLINE_MAX else None
        if slot is not None:
            try:
                data = marshal.dumps(("slot", slot, *self._slots.put(slot, data)))
            except OSError:  # no shared memory to be had (a full /dev/shm): the pipe
                slot = None
        if self._send(data, rows):
            self._inflight.append(slot)

    def wait_for_room(self) -> int | None:
        """Wait until the next shared-memory slot is free (the chunk it held answered
        for); returns it, or None once the child is gone. The recorder waits here
        before it takes a chunk from its queue, so a chunk is what came while the
        child wrote, not what came while the last one was copied in (half as much,
        each chunk's fixed costs twice as often)."""
        slot = self._slots.next
        while slot in self._inflight and self._proc.exitcode is None and not self._finished:
            self._collect(0.05)
        return slot if self._proc.exitcode is None and not self._finished else None

    def take_failed(self) -> int:
        """Rows dropped since the last call."""
        self._collect()
        failed, self.failed_rows = self.failed_rows, 0
        return failed

    def trim_raw(self, before_ns: int) -> int:
        """Ask the child to trim (``WatchWriter.trim_raw``); returns the rows trimmed
        so far, as the child reported them."""
        self._send(("trim", before_ns))
        self._collect()
        trimmed, self.trimmed_rows = self.trimmed_rows, 0
        return trimmed

    def finish(self, status: str, dropped_rows: int) -> None:
        """Mark the run ended and stop the child (after it wrote what it was given)."""
        if self._send(("finish", status, dropped_rows)):
            while self._proc.is_alive() or self._pipe.poll(0):
                last = self._collect(FINISH_TIMEOUT_S)
                if last is None or last[0] == "finished":
                    break
        self._proc.join(FINISH_TIMEOUT_S if self._proc.is_alive() else 1.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        if not self._finished:  # died, failed or was killed: what it held is lost
            self._collect()
            self._died()
        self._pipe.close()
        self._slots.close()


def _serve(db_path: str, run_id: int, rows_written: int, freeze_gc: bool, pipe: Connection) -> None:
    """The child: write what the watching process hands over until it says finish.

    What it cannot recover from (its last write failing, mostly) ends it with exit
    status 1 and its reason sent to the watching process (or, with that gone, one
    ``kvscope: error:`` line), never multiprocessing's traceback."""
    try:
        _serve_until_finished(db_path, run_id, rows_written, freeze_gc, pipe)
    except Exception as exc:
        reason = f"the watch's writer process: {exc}"
        try:
            pipe.send(("fatal", reason))  # the watching process says it, once
        except (OSError, ValueError):  # the watching process is gone too: say it here
            print(f"kvscope: error: {reason}", file=sys.stderr, flush=True)
        sys.exit(1)


def _serve_until_finished(
    db_path: str, run_id: int, rows_written: int, freeze_gc: bool, pipe: Connection
) -> None:
    from kvscope.db.store import open_db
    from kvscope.profiler.watch.writer import WatchWriter

    # The watching process decides when to stop: Ctrl-C, or a supervisor's SIGTERM to
    # the whole group, reaches this child too, which then writes what it is handed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if freeze_gc:
        # As in a watching process of its own (WatchRecorder): the aggregates' long-lived
        # objects are moved out of the collector's reach after each write (gc.freeze
        # below), and a young generation far larger than one write leaves behind (its
        # rows, hash lists and tree records: ~16,000 tracked objects net for a
        # prefill-like 2,000-batch chunk, ~36,000 for a one-hash one) means no
        # collection looks at them during it. Every 10,000 they had: 8 collections of
        # 2-11 ms each per 1.2M prefill-like block events, ~6 % of this process's CPU
        # (bench/watch_rate.py's chunks through WatchWriter.write, gc.callbacks timing).
        # What a write makes is not cyclic (rows, lists, ints, records of hashes):
        # refcounts free its garbage, and a later collection would find any cycle.
        gc.set_threshold(500_000, 10, 10)
    try:
        db = open_db(db_path)
        writer = WatchWriter(db, run_id)
        writer.rows_written = rows_written
    except Exception as exc:
        pipe.send(("error", str(exc)))
        return
    pipe.send(("ready", None))
    dropped = 0
    slots = SlotReader()
    try:
        while True:
            try:
                message = marshal.loads(pipe.recv_bytes())
            except (EOFError, OSError) as exc:
                raise _WatcherGone from exc
            if message[0] == "slot":  # a large write, in shared memory
                message = slots.read(*message[1:])
            kind = message[0]
            if kind == "write":
                _, fields, dropped = message
                batch = WatchBatch(**dict(zip(_BATCH_FIELDS, fields, strict=True)))
                rows = len(batch.blocks) + len(batch.raw)
                try:
                    writer.write(batch, dropped)
                except Exception as exc:  # a full disk must not end the watch: counted, said
                    _answer(pipe, ("failed", rows, str(exc)))
                    continue
                if freeze_gc:
                    gc.freeze()
                _answer(pipe, ("written", writer.rows_written, rows, writer.committed_at))
            elif kind == "trim":
                try:
                    trimmed = writer.trim_raw(message[1])
                except Exception:  # a busy or full disk: the next minute tries again
                    trimmed = 0
                _answer(pipe, ("trimmed", trimmed))
            elif kind == "finish":
                _, status, dropped = message
                try:
                    writer.finish(status, dropped)
                    db.conn.close()
                except Exception as exc:  # a full disk, a locked database: _serve says it
                    raise KvscopeError(f"ending run {run_id} failed: {exc}") from exc
                try:
                    pipe.send(("finished", writer.rows_written))
                except OSError:  # gone meanwhile: the run is ended all the same
                    pass
                # Everything is committed and closed: exit now rather than have the
                # interpreter free the aggregates' state object by object on the way out
                # (64 ms after a 1.2M-event burst, 163 ms after 6.1M, seconds after a
                # long session's hundreds of MB), which the watching process's stop
                # waited for.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
    except _WatcherGone:
        # The watching process died, between writes or during one (its answer then
        # finds the pipe closed): what was written stays, and the run says it did not
        # end well, so a later watch of the same sources resumes it.
        try:
            writer.finish(FAILED, dropped)
            db.conn.close()
        except Exception:
            pass
        slots.unlink()


class _WatcherGone(Exception):
    """The watching process is gone: its pipe closed under a read or an answer."""


def _answer(pipe: Connection, message: tuple) -> None:
    try:
        pipe.send(message)
    except (EOFError, OSError) as exc:  # BrokenPipeError among them
        raise _WatcherGone from exc
