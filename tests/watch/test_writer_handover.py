"""Large chunks reach the watch's writer process through shared-memory slots
(profiler.watch.handover): whole, in order, with the slots grown as chunks grow
and none left behind; a child that dies with both slots full still has every
row counted, and no shared memory to be had sends the chunk through the pipe."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from multiprocessing import shared_memory
from pathlib import Path

import pytest

import kvscope.profiler.watch.handover as handover
from kvscope.db.schema import COMPLETE
from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_STORED
from kvscope.profiler.watch.recorder import EAGER_FLUSH
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import expand_sources
from kvscope.profiler.watch.writer_process import WriterProcess

from support.watch_helpers import new_watch_run, wait_until
from support.watch_payloads import vllm_stored

SOURCE = (0, "events", "vllm", "tcp://a:1", None, "", None, 0)
ROW_TEXT = 24  # bytes of JSON text per row below: a batch of n rows marshals to ~n * 70


def _batch(first: int, rows: int, *, sources: bool = False) -> WatchBatch:
    """``rows`` one-hash stored events with hashes (and sequence numbers) from ``first``."""
    hashes = range(first, first + rows)
    return WatchBatch(
        sources=[SOURCE] if sources else [],
        blocks=[
            (0, h, h * 1000, OP_STORED, f"[{h:0{ROW_TEXT - 2}d}]", None, "GPU", 0, 1)
            for h in hashes
        ],  # fmt: skip
        hash_lists=[[h] for h in hashes],
    )


def _on_disk(path: Path, run_id: int) -> tuple[list[int], int]:
    """(every stored row's seq in rowid order, blocks the aggregates counted stored)."""
    conn = sqlite3.connect(path)
    try:
        seqs = [s for (s,) in conn.execute(
            "SELECT seq FROM watch_blocks WHERE run_id = ? ORDER BY rowid", (run_id,)
        )]  # fmt: skip
        (stored,) = conn.execute(
            "SELECT stored FROM watch_source_stats WHERE run_id = ? AND source = 0", (run_id,)
        ).fetchone()
        return seqs, stored
    finally:
        conn.close()


def _slot_names(writer: WriterProcess) -> list[str]:
    return [shm.name for shm in writer._slots._shm if shm is not None]


def _gone(name: str) -> bool:
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return True
    shm.close()
    return False


def test_large_chunks_go_through_growing_slots_whole_and_in_order(tmp_path: Path) -> None:
    """Chunks of 10k, 20k and 60k rows (~0.7-4 MB, over the pipe's INLINE_MAX): slot 0,
    slot 1, then slot 0 again, grown into a new segment; every row arrives once, in
    order, folded; the slots are unlinked when the writer finishes."""
    path = tmp_path / "w.db"
    db, run_id = new_watch_run(path)
    db.conn.close()
    writer = WriterProcess(path, run_id)
    sizes = (10_000, 20_000, 60_000)
    first, names = 0, []
    for i, rows in enumerate(sizes):
        writer.write(_batch(first, rows, sources=i == 0))
        first += rows
        names.append(_slot_names(writer))
    assert len(names[0]) == 1 and len(names[1]) == 2  # slot 0, then slot 1
    assert names[2][0] != names[1][0] and names[2][1] == names[1][1]  # slot 0 grew
    grown_away = names[1][0]
    writer.finish(COMPLETE, 0)
    assert writer.take_failed() == 0 and writer.error is None
    seqs, stored = _on_disk(path, run_id)
    assert seqs == list(range(sum(sizes))) and stored == sum(sizes)
    assert all(_gone(n) for n in (grown_away, *names[2]))


def test_a_small_batch_still_goes_through_the_pipe(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    db, run_id = new_watch_run(path)
    db.conn.close()
    writer = WriterProcess(path, run_id)
    writer.write(_batch(0, 100, sources=True))  # ~7 KB
    assert _slot_names(writer) == []
    writer.finish(COMPLETE, 0)
    assert _on_disk(path, run_id) == (list(range(100)), 100)


def test_a_child_killed_with_both_slots_full_counts_every_chunk(tmp_path: Path) -> None:
    """The child stuck in a write (a lock another connection holds) with the next
    chunk waiting in the other slot: a third chunk waits for a slot until the child
    is killed, then returns; all three are counted dropped, what was written before
    stays, and the slots are unlinked."""
    path = tmp_path / "w.db"
    db, run_id = new_watch_run(path)
    db.conn.close()
    writer = WriterProcess(path, run_id)
    rows = 10_000
    writer.write(_batch(0, rows, sources=True))
    wait_until(lambda: writer._collect() or writer.rows_written == rows)  # on disk
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # the child's next write waits on this lock
    writer.write(_batch(rows, rows))  # slot 1: the child is writing it, stuck
    writer.write(_batch(2 * rows, rows))  # slot 0, free again: waits behind it
    killer = threading.Timer(0.5, os.kill, (writer._proc.pid, signal.SIGKILL))
    killer.start()
    writer.write(_batch(3 * rows, rows))  # slot 1 is not answered for: waits
    killer.join()
    locker.execute("ROLLBACK")
    locker.close()
    names = _slot_names(writer)
    writer.finish(COMPLETE, 0)
    dropped = writer.take_failed()
    assert "writer process died (exit status -9)" in writer.error
    seqs, stored = _on_disk(path, run_id)
    assert seqs == list(range(rows)) and stored == rows
    assert dropped == 3 * rows
    assert names and all(_gone(n) for n in names)


def test_no_shared_memory_to_be_had_sends_the_chunk_through_the_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full /dev/shm (a tmpfs of 64 MB in a default docker container) answers the
    reservation with ENOSPC: the chunk goes through the pipe instead, whole."""

    def full(size: int):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(handover, "_reserved", full)
    path = tmp_path / "w.db"
    db, run_id = new_watch_run(path)
    db.conn.close()
    writer = WriterProcess(path, run_id)
    writer.write(_batch(0, 20_000, sources=True))
    assert _slot_names(writer) == []
    writer.finish(COMPLETE, 0)
    assert _on_disk(path, run_id) == (list(range(20_000)), 20_000)


def test_a_burst_is_handed_over_in_chunks_that_at_most_double(
    tmp_path: Path, publishers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of 3,000 batches to a watch with a writer process: the first chunk is
    at most EAGER_FLUSH batches, so the writer starts on it at once instead of
    waiting for the hundreds queued meanwhile, and each next chunk at most twice the
    one before (the backlog then goes in full chunks); every batch is recorded."""
    chunks: list[int] = []
    write = WriterProcess.write

    def spy(self, batch, dropped_rows=0):
        if batch.blocks:
            chunks.append(len(batch.blocks))  # one row per batch below
        write(self, batch, dropped_rows)

    monkeypatch.setattr(WriterProcess, "write", spy)
    pub = publishers(dp_rank=0)
    session = WatchSession(tmp_path / "w.db", expand_sources(pub.endpoint),
                           writer_process=True).start()  # fmt: skip
    pub.wait_for_subscribers()
    for i in range(3000):
        pub.publish([vllm_stored([i + 1], None)])
    wait_until(lambda: session.status().rows_written >= 3000, timeout_s=60)
    status = session.stop()
    assert status.block_events == 3000 and sum(chunks) == 3000
    assert chunks[0] <= EAGER_FLUSH
    assert all(b <= max(EAGER_FLUSH, 2 * a) for a, b in zip(chunks, chunks[1:], strict=False))
    assert max(chunks) > EAGER_FLUSH  # the backlog did grow them
