"""The watch's writer process (profiler.watch.writer_process) against real failures:
a child killed mid-stream loses rows, but every one is counted (rows sent = rows
stored + rows counted dropped, exactly), and a last write that fails ends the
watch with one ``kvscope: error:`` line, never a traceback."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from kvscope.db.schema import COMPLETE
from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_STORED
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import expand_sources
from kvscope.profiler.watch.writer_process import WriterProcess

from support.watch_helpers import new_watch_run, wait_until
from support.watch_payloads import vllm_stored

SOURCE = (0, "events", "vllm", "tcp://a:1", None, "", None, 0)


def _new_run(path: Path) -> int:
    db, run_id = new_watch_run(path)
    db.conn.close()
    return run_id


def _batch(first_seq: int, blocks: int, raw: int, *, sources: bool = False) -> WatchBatch:
    """``blocks`` one-hash stored events and ``raw`` unknown events, seqs from ``first_seq``."""
    seqs = range(first_seq, first_seq + blocks)
    return WatchBatch(
        sources=[SOURCE] if sources else [],
        blocks=[(0, s, s * 1000, OP_STORED, f"[{s}]", None, "GPU", 0, 1) for s in seqs],
        raw=[(0, first_seq + i, first_seq * 1000, "Unknown", "{}") for i in range(raw)],
    )


def _stored(path: Path, run_id: int) -> tuple[int, int, int]:
    """(block rows, raw rows, blocks folded into the aggregates) on disk."""
    conn = sqlite3.connect(path)
    try:
        blocks = conn.execute("SELECT COUNT(*) FROM watch_blocks WHERE run_id = ?", (run_id,))
        raw = conn.execute("SELECT COUNT(*) FROM watch_raw WHERE run_id = ?", (run_id,))
        folded = conn.execute(
            "SELECT COALESCE(SUM(stored), 0) FROM watch_series WHERE run_id = ? AND width_s = "
            "(SELECT MIN(width_s) FROM watch_series WHERE run_id = ?)",
            (run_id, run_id),
        )
        return blocks.fetchone()[0], raw.fetchone()[0], folded.fetchone()[0]
    finally:
        conn.close()


def _wait_written(writer: WriterProcess, rows: int) -> None:
    deadline = time.monotonic() + 30
    while writer.rows_written < rows:
        assert time.monotonic() < deadline, writer.rows_written
        writer._collect(0.1)


def test_a_child_killed_while_writing_a_batch_loses_nothing_uncounted(tmp_path: Path) -> None:
    """SIGKILL while the child is inside a write (held on a lock another connection
    holds) with a second batch waiting in the pipe: both, and one sent after, are
    counted dropped; what it wrote before stays."""
    path = tmp_path / "w.db"
    run_id = _new_run(path)
    writer = WriterProcess(path, run_id)
    sent = dropped = 0
    for i in range(3):
        writer.write(_batch(i * 1000, 900, 100, sources=i == 0))
        sent += 1000
    _wait_written(writer, 3000)
    dropped += writer.take_failed()
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # the child's next write waits on this lock
    writer.write(_batch(3000, 900, 100))  # received: the child is writing it
    writer.write(_batch(4000, 900, 100))  # waiting in the pipe behind it
    sent += 2000
    time.sleep(0.5)  # well within the child's 5 s busy timeout
    os.kill(writer._proc.pid, signal.SIGKILL)
    writer._proc.join(5)
    locker.execute("ROLLBACK")
    locker.close()
    writer.write(_batch(5000, 900, 100))  # after the death: refused, counted
    sent += 1000
    dropped += writer.take_failed()
    writer.finish(COMPLETE, dropped)
    dropped += writer.take_failed()
    assert "writer process died (exit status -9)" in writer.error
    blocks, raw, folded = _stored(path, run_id)
    assert (blocks, raw, folded, writer.rows_written) == (2700, 300, 2700, 3000)
    assert dropped == 3000  # the two batches the child held, and the one after
    assert blocks + raw + dropped == sent == 6000


@pytest.mark.parametrize("kill_after", [3, 11])
def test_a_child_killed_mid_stream_stored_plus_dropped_is_what_was_sent(
    tmp_path: Path, kill_after: int
) -> None:
    """A stream of batches, the child killed without waiting for it: however many
    it had written, stored + dropped = sent, exactly, and no half batch is stored."""
    path = tmp_path / "w.db"
    run_id = _new_run(path)
    writer = WriterProcess(path, run_id)
    size, sent, dropped = 4000, 0, 0
    for i in range(16):
        writer.write(_batch(i * size, size - 500, 500, sources=i == 0))
        sent += size
        dropped += writer.take_failed()
        if i == kill_after:
            os.kill(writer._proc.pid, signal.SIGKILL)
    writer.finish(COMPLETE, dropped)
    dropped += writer.take_failed()
    blocks, raw, folded = _stored(path, run_id)
    assert blocks + raw + dropped == sent == 16 * size
    assert (blocks + raw) % size == 0 and blocks == folded == (blocks + raw) // size * 3500
    assert writer.rows_written == blocks + raw
    assert dropped >= (16 - kill_after - 1) * size  # at least the batches sent after it


def test_a_failed_last_write_says_one_error_line_not_a_traceback(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The child's finish meets a database another process keeps locked (past its
    busy timeout): exit status 1, no traceback, and the watching process is told why
    (its recorder marks the run failed; the command prints the one error line)."""
    path = tmp_path / "w.db"
    run_id = _new_run(path)
    writer = WriterProcess(path, run_id)
    writer.write(_batch(0, 90, 10, sources=True))
    _wait_written(writer, 100)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        writer.finish(COMPLETE, 0)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    err = capfd.readouterr().err
    # Nothing on stderr: the watching process is alive, is told why, and says it once.
    assert err.strip() == ""
    assert writer._proc.exitcode == 1
    assert writer.error == (
        f"the watch's writer process: ending run {run_id} failed: database is locked"
    )
    assert writer.take_failed() == 0  # its one batch was written
    conn = sqlite3.connect(path)
    try:
        status, written = conn.execute(
            "SELECT status, events_written FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
    finally:
        conn.close()
    assert (status, written) == ("running", 100)  # not ended: the recorder marks it failed


def test_a_watch_whose_writer_is_killed_counts_its_losses_in_the_run(
    tmp_path: Path, publishers
) -> None:
    """End to end (real sockets, recorder, child): killed while it holds rows it was
    handed (its write waiting on a lock another connection holds), the run's row says
    they and those received after were dropped: stored + dropped = received."""
    pub = publishers()
    path = tmp_path / "w.db"
    session = WatchSession(path, expand_sources(pub.endpoint), writer_process=True).start()
    pub.wait_for_subscribers()

    def publish(first: int, count: int) -> None:
        for h in range(first, first + count):
            pub.publish([vllm_stored([h + 1])])
        wait_until(lambda: session.status().batches == first + count)

    publish(0, 100)
    wait_until(lambda: session.status().rows_written == 100)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    publish(100, 100)
    wait_until(lambda: session.status().queued == 0)  # all handed to the child
    time.sleep(0.3)
    os.kill(session.recorder._writer._proc.pid, signal.SIGKILL)
    locker.execute("ROLLBACK")
    locker.close()
    publish(200, 100)
    status = session.stop()
    assert status.block_events == 300
    conn = sqlite3.connect(path)
    try:
        (stored,) = conn.execute("SELECT COUNT(*) FROM watch_blocks").fetchone()
        run = conn.execute("SELECT status, events_written, dropped_events FROM runs").fetchone()
    finally:
        conn.close()
    assert (stored, *run) == (100, "failed", 100, 200)
