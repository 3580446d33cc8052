"""kvscope watch against publishers framing exactly as vLLM does, over real ZMQ sockets:
ordering, replay of gaps, lost batches, restarts, reconnects, DP ranks, fan-in,
/metrics scraping, and the database reconciled with what was sent."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from kvscope.app.commands.watch import _line, _live
from kvscope.db import watch_read as q
from kvscope.db.schema import INTERRUPTED
from kvscope.db.watch_schema import OP_REMOVED, OP_RESET, OP_STORED
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import expand_sources
from kvscope.profiler.watch.wire import to_signed64

from support.watch_helpers import free_port, wait_until
from support.watch_payloads import vllm_removed, vllm_stored


def _hashes(rng: random.Random, n: int) -> list[int]:
    return [rng.getrandbits(64) for _ in range(n)]


def _session(db: Path, specs, **kwargs) -> WatchSession:
    return WatchSession(db, specs, **kwargs).start()


def _rows(db: Path, sql: str, *args) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("writer_process", [False, True])
def test_records_what_was_sent(tmp_path: Path, publishers, writer_process: bool) -> None:
    """In a writer thread (tests, embedding) or a writer process (kvscope watch)."""
    rng = random.Random(1)
    pub = publishers(replay_endpoint="tcp://127.0.0.1:*", dp_rank=0)
    session = _session(
        tmp_path / "w.db",
        expand_sources(pub.endpoint, replay=pub.replay_endpoint),
        writer_process=writer_process,
    )
    pub.wait_for_subscribers()
    sent: list[tuple[int, int, int | None]] = []  # (op, hash, parent) in order
    parent = None
    for _ in range(50):
        hashes = _hashes(rng, rng.randint(1, 5))
        pub.publish([vllm_stored(hashes, parent)])
        for h in hashes:
            sent.append(
                (OP_STORED, to_signed64(h), None if parent is None else to_signed64(parent))
            )
            parent = h
        pub.publish([vllm_removed(hashes[:1])])
        sent.append((OP_REMOVED, to_signed64(hashes[0]), None))
    wait_until(lambda: session.status().batches == 100)
    status = session.stop()
    assert (status.gaps, status.lost_batches, status.restarts) == (0, 0, 0)
    assert status.block_events == len(sent)
    rows = _rows(
        tmp_path / "w.db",
        "SELECT op, block_hash, parent_hash, seq, medium FROM watch_block_hashes "
        "ORDER BY event_id, position",
    )
    assert [r[:3] for r in rows] == sent
    assert [r[3] for r in rows] == sorted(r[3] for r in rows)  # in sequence order
    assert {r[4] for r in rows} == {"GPU"}
    ((kind, status_text, written),) = _rows(
        tmp_path / "w.db", "SELECT kind, status, events_written FROM runs"
    )
    assert (kind, status_text, written) == ("watch", "complete", 100)  # KV events
    (src,) = q.watch_sources(tmp_path / "w.db", session.run_id)
    assert (src.batches, src.last_seq, src.block_size, src.block_events) == (100, 99, 16, len(sent))


@pytest.mark.parametrize("replay_frames", [3, 2])
def test_gap_is_filled_from_the_replay_buffer(
    tmp_path: Path, publishers, replay_frames: int
) -> None:
    pub = publishers(replay_endpoint="tcp://127.0.0.1:*", replay_frames=replay_frames)
    session = _session(tmp_path / "w.db", expand_sources(pub.endpoint, replay=pub.replay_endpoint))
    pub.wait_for_subscribers()
    pub.publish([vllm_stored([1])])
    pub.drop_next(3)
    for h in range(2, 7):
        pub.publish([vllm_stored([h], h - 1)])
    wait_until(lambda: session.status().batches == 6)
    status = session.stop()
    assert (status.gaps, status.recovered_batches, status.lost_batches) == (1, 3, 0)
    db = tmp_path / "w.db"
    assert _rows(db, "SELECT seq, block_hashes FROM watch_blocks ORDER BY rowid") == [
        (s, f"[{s + 1}]") for s in range(6)
    ]
    gap = [i for i in q.incidents(db, session.run_id) if i.kind == "gap"]
    assert [(i.first_seq, i.last_seq, i.recovered, i.lost) for i in gap] == [(1, 3, 3, 0)]


def test_unrecovered_gaps_are_counted(tmp_path: Path, publishers) -> None:
    no_replay = publishers()
    small_buffer = publishers(replay_endpoint="tcp://127.0.0.1:*", buffer_steps=2)
    specs = expand_sources(no_replay.endpoint) + expand_sources(
        small_buffer.endpoint, replay=small_buffer.replay_endpoint
    )
    session = _session(tmp_path / "w.db", specs)
    for pub in (no_replay, small_buffer):
        pub.wait_for_subscribers()
        pub.publish([vllm_stored([1])])
        pub.drop_next(4)
        for h in range(2, 7):
            pub.publish([vllm_stored([h])])
    # Each sent seqs 0 and 5 of 0-5. Without replay seqs 1-4 are lost; a 2-batch
    # buffer still holds seqs 4 and 5, so only 4 comes back.
    wait_until(lambda: session.status().batches == 2 + 3)
    status = session.stop()
    first, second = q.watch_sources(tmp_path / "w.db", session.run_id)
    assert (first.gaps, first.recovered_batches, first.lost_batches) == (1, 0, 4)
    assert (second.gaps, second.recovered_batches, second.lost_batches) == (1, 1, 3)
    assert status.lost_batches == 7
    details = [i.detail for i in q.incidents(tmp_path / "w.db", session.run_id) if i.kind == "gap"]
    assert details == ["no replay endpoint", "replay buffer no longer holds them"]


def test_restart_resets_the_source(tmp_path: Path, publishers) -> None:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    first = publishers(f"tcp://*:{port}")
    db = tmp_path / "w.db"
    session = _session(db, expand_sources(endpoint))
    first.wait_for_subscribers()
    for h in range(5):
        first.publish([vllm_stored([10 + h])])
    wait_until(lambda: session.status().batches == 5)
    first.close()
    wait_until(lambda: session.status().disconnects == 1)
    second = publishers(f"tcp://*:{port}")  # the engine came back: seq from 0 again
    second.wait_for_subscribers()
    second.publish([vllm_stored([99])])
    second.publish([vllm_stored([100], 99)])
    wait_until(lambda: session.status().batches == 7)
    status = session.stop()
    assert status.restarts == 1
    ops = _rows(db, "SELECT op, block_hashes FROM watch_blocks ORDER BY rowid")
    assert ops == [(OP_STORED, f"[{10 + h}]") for h in range(5)] + [
        (OP_RESET, None),
        (OP_STORED, "[99]"),
        (OP_STORED, "[100]"),
    ]
    kinds = [i.kind for i in q.incidents(db, session.run_id)]
    assert kinds.count("restart") == 1 and "disconnected" in kinds
    assert kinds.count("connected") == 2
    (stats,) = q.block_stats(db, session.run_id)
    assert stats.resets == 1 and stats.cached == {"GPU": 2}  # the old engine's 5 are gone


def test_eight_dp_ranks_over_ipc(tmp_path: Path, publishers) -> None:
    base = f"ipc://{tmp_path}/kv"
    specs = expand_sources(base, dp_size=8)
    pubs = [publishers(spec.endpoint, dp_rank=spec.dp_rank) for spec in specs]
    session = _session(tmp_path / "w.db", specs)
    for rank, pub in enumerate(pubs):
        pub.wait_for_subscribers()
        for i in range(rank + 1):
            pub.publish([vllm_stored([1000 * rank + i])])
    wait_until(lambda: session.status().batches == sum(range(1, 9)))
    session.stop()
    sources = q.watch_sources(tmp_path / "w.db", session.run_id)
    assert [(s.dp_rank, s.batches, s.endpoint) for s in sources] == [
        (r, r + 1, base if r == 0 else f"{base}_dp{r}") for r in range(8)
    ]


def test_listen_fan_in_splits_streams_by_topic_and_dp_rank(tmp_path: Path, publishers) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    session = _session(tmp_path / "w.db", expand_sources(endpoint, listen=True))
    # vLLM connects (no wildcard in the endpoint) to the listening kvscope; each
    # engine numbers its batches from 0, so they must not be taken for one stream.
    pubs = [publishers(endpoint, dp_rank=rank) for rank in (0, 1)]
    pubs.append(publishers(endpoint, dp_rank=0, topic="other-server"))
    for rank, pub in enumerate(pubs):
        pub.wait_for_subscribers()
        for i in range(3 + rank):
            pub.publish([vllm_stored([100 * rank + i])])
    wait_until(lambda: session.status().batches == 3 + 4 + 5)
    status = session.stop()
    assert status.gaps == 0 and status.restarts == 0  # three seq 0..n streams, not one mess
    sources = q.watch_sources(tmp_path / "w.db", session.run_id)
    # Streams become sources in the order their first batch arrives, which fan-in over
    # one socket does not fix: compare them sorted.
    rows = [(s.topic, s.dp_rank, s.batches, s.listen) for s in sources]
    assert sorted(rows, key=lambda r: (r[0], -1 if r[1] is None else r[1])) == [
        ("", None, 0, True),  # the listening socket itself
        ("", 0, 3, True),
        ("", 1, 4, True),
        ("other-server", 0, 5, True),
    ]


def test_listen_with_dp_ranks_binds_a_port_each(tmp_path: Path, publishers) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port(consecutive=2)}"
    specs = expand_sources(endpoint, listen=True, dp_size=2)
    session = _session(tmp_path / "w.db", specs)
    for spec in specs:
        pub = publishers(spec.endpoint, dp_rank=spec.dp_rank)
        pub.wait_for_subscribers()
        pub.publish([vllm_stored([spec.dp_rank])])
    wait_until(lambda: session.status().batches == 2)
    session.stop()
    sources = q.watch_sources(tmp_path / "w.db", session.run_id)
    assert [(s.dp_rank, s.batches) for s in sources] == [(0, 1), (1, 1)]


def test_metrics_scraped_and_hit_rate_from_counters(
    tmp_path: Path, publishers, metrics_server
) -> None:
    url, metrics = metrics_server
    pub = publishers()
    session = _session(
        tmp_path / "w.db", expand_sources(pub.endpoint), metrics_urls=(url,), scrape_interval_s=0.02
    )
    wait_until(lambda: session.status().scrapes >= 5)
    session.stop()
    db = tmp_path / "w.db"
    (series,) = q.engine_series(db, session.run_id)
    assert series.engine == "vllm" and series.usage_level == "blocks"
    scrapes = len(series.running)
    assert scrapes >= 5 and [p.value for p in series.running] == list(range(scrapes))
    assert [p.value for p in series.hit_rate] == [0.25] * (scrapes - 1)
    assert [round(p.value, 9) for p in series.ttft_mean_s] == [0.05] * (scrapes - 1)
    assert _rows(db, "SELECT model FROM runs") == [("m",)]  # from the model_name label
    assert [round(p.value, 9) for p in series.usage] == [
        round(0.1 * (n % 5), 9) for n in range(scrapes)
    ]


def test_failed_scrape_is_an_incident(tmp_path: Path, publishers) -> None:
    pub = publishers()
    url = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
    session = _session(
        tmp_path / "w.db", expand_sources(pub.endpoint), metrics_urls=(url,), scrape_interval_s=0.02
    )
    wait_until(lambda: any(i.kind == "scrape_error" for i in _incidents_now(session)))
    session.stop()
    errors = [i for i in q.incidents(tmp_path / "w.db", session.run_id) if i.kind == "scrape_error"]
    assert len(errors) == 1 and url in errors[0].detail  # one per outage, not per try
    # The live line says so as it happens, with the reason.
    line = _line(session.status())
    assert "scrape errors " in line and "Connection refused" in line, line


def _incidents_now(session: WatchSession) -> list:
    session.recorder.flush()
    return q.incidents(session.recorder._db, session.run_id)


def test_undecodable_batch_is_counted_not_replayed(tmp_path: Path, publishers) -> None:
    pub = publishers(replay_endpoint="tcp://127.0.0.1:*")
    session = _session(tmp_path / "w.db", expand_sources(pub.endpoint, replay=pub.replay_endpoint))
    pub.wait_for_subscribers()
    pub.publish([vllm_stored([1])])
    pub.publish_payload(b"\xc1 not msgpack")
    pub.publish([vllm_stored([2], 1)])
    wait_until(lambda: session.status().batches == 2)
    status = session.stop()
    assert (status.bad_messages, status.gaps, status.lost_batches) == (1, 0, 0)
    (bad,) = [i for i in q.incidents(tmp_path / "w.db", session.run_id) if i.kind == "bad_message"]
    assert (bad.first_seq, bad.last_seq) == (1, 1) and "not msgpack" in bad.detail
    line = _line(status)
    assert line.startswith("1 source  ") and "bad messages 1 (" in line, line


def test_one_engine_pushing_to_a_listening_watch_is_one_source(tmp_path: Path, publishers) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    session = _session(tmp_path / "w.db", expand_sources(endpoint, listen=True))
    assert session.status().sources == 1  # listening, nothing arrived yet
    pub = publishers(endpoint, topic="kv-events", dp_rank=0)
    pub.wait_for_subscribers()
    pub.publish([vllm_stored([1])])
    wait_until(lambda: session.status().batches == 1)
    status = session.stop()
    assert status.sources == 1 and _line(status).startswith("1 source  ")


def test_the_live_line_leaves_no_stale_characters() -> None:
    assert _live("2 sources  scrapes 0", tty=True) == "\r2 sources  scrapes 0\x1b[K"
    assert _live("x", tty=False) == "x"


@pytest.mark.parametrize(
    ("replay", "writer_process"), [(True, False), (False, False), (True, True)]
)
def test_a_watch_started_again_resumes_its_run(
    tmp_path: Path, publishers, replay: bool, writer_process: bool
) -> None:
    """Stopped and started again on the same file: the same run carries on after its
    last recorded batch; what the replay buffer still has comes back, the rest is
    recorded lost; nothing twice; the cache state it had is where it starts."""
    pub = publishers(replay_endpoint="tcp://127.0.0.1:*" if replay else None)
    specs = expand_sources(pub.endpoint, replay=pub.replay_endpoint if replay else None)
    config = {"sources": [s.endpoint for s in specs], "engine": "vllm"}
    db = tmp_path / "w.db"
    first = _session(db, specs, config=config, writer_process=writer_process)
    pub.wait_for_subscribers()
    for h in range(5):
        pub.publish([vllm_stored([h])])  # seq 0-4
    wait_until(lambda: first.status().batches == 5)
    first.stop(INTERRUPTED)
    # While nobody watches, the engine goes on: two removals and a store (seq 5-7).
    pub.publish([vllm_removed([0])])
    pub.publish([vllm_removed([1])])
    pub.publish([vllm_stored([7])])
    second = _session(db, specs, config=config, writer_process=writer_process)
    assert second.recorder.resumed and second.run_id == first.run_id
    pub.wait_for_subscribers()
    pub.publish([vllm_stored([8])])  # seq 8: the gap 5-7 is noticed
    pub.publish([vllm_removed([2])])  # seq 9: stored before the restart of the watch
    wait_until(lambda: second.status().batches == (10 if replay else 7))
    status = second.stop()
    assert (status.gaps, status.recovered_batches, status.lost_batches) == (
        (1, 3, 0) if replay else (1, 0, 3)
    )
    assert _rows(db, "SELECT COUNT(*), COUNT(DISTINCT seq) FROM watch_blocks") == [
        (10, 10) if replay else (7, 7)
    ]
    assert _rows(db, "SELECT COUNT(*), MAX(status) FROM runs") == [(1, "complete")]
    (stats,) = q.block_stats(db, first.run_id)
    assert stats.removed_unknown == 0  # block 2 was known from the first watch
    assert stats.cached == ({"GPU": 4} if replay else {"GPU": 5})
    assert stats.stored == (7 if replay else 6)
    kinds = [i.kind for i in q.incidents(db, first.run_id)]
    assert "resumed" in kinds and "gap" in kinds
    fresh = _session(db, specs, config=config, resume=False)  # kvscope watch --new-run
    assert not fresh.recorder.resumed and fresh.run_id == first.run_id + 1
    fresh.stop()


def test_a_run_whose_watch_died_with_its_writer_is_resumed(tmp_path: Path, publishers) -> None:
    """kill -9 of the whole group (or the OOM killer, a reboot) leaves the run
    'running' with nothing writing it: a watch started again resumes it once its
    heartbeat is stale and its watching process gone, and never takes over a run
    whose writer may still be there."""
    import os
    import subprocess
    import time

    pub = publishers()
    specs = expand_sources(pub.endpoint)
    config = {"sources": [s.endpoint for s in specs], "engine": "vllm"}
    db = tmp_path / "w.db"
    first = _session(db, specs, config=config)
    pub.wait_for_subscribers()
    pub.publish([vllm_stored([1, 2])])
    wait_until(lambda: first.status().batches == 1)
    first.stop(INTERRUPTED)
    dead = subprocess.Popen(["true"])
    dead.wait()

    def left_running(pid: int, heartbeat_age_s: float) -> None:
        conn = sqlite3.connect(db)
        with conn:
            conn.execute(
                "UPDATE runs SET status = 'running', ended_at = NULL, writer_pid = ?, "
                "heartbeat = ?",
                (pid, time.time() - heartbeat_age_s),
            )
        conn.close()

    for pid, age_s in ((os.getpid(), 60.0), (dead.pid, 1.0)):  # alive; or just died
        left_running(pid, age_s)
        other = _session(db, specs, config=config)
        assert not other.recorder.resumed and other.run_id != first.run_id
        other.stop()
        sqlite3.connect(db).execute(
            "DELETE FROM runs WHERE id = ?", (other.run_id,)
        ).connection.commit()
    left_running(dead.pid, 60.0)
    second = _session(db, specs, config=config)
    assert second.recorder.resumed and second.run_id == first.run_id
    second.stop()
    # the cache it had carries on (what a removal after the seam finds: the resume test above)
    (stats,) = q.block_stats(db, first.run_id)
    assert (stats.stored, stats.cached) == (2, {"GPU": 2})
    assert "resumed" in [i.kind for i in q.incidents(db, first.run_id)]


def test_a_restart_that_overtook_the_old_numbering_is_detected(tmp_path: Path, publishers) -> None:
    """The engine restarted and published past our last sequence number before we
    saw it: not a gap of the old engine but a restart, found in the replay buffer
    (its batch of our last number is another one); its new batches are replayed."""
    pub = publishers(replay_endpoint="tcp://127.0.0.1:*")
    db = tmp_path / "w.db"
    session = _session(db, expand_sources(pub.endpoint, replay=pub.replay_endpoint))
    pub.wait_for_subscribers()
    for h in range(3):
        pub.publish([vllm_stored([10 + h])])  # seq 0-2
    wait_until(lambda: session.status().batches == 3)
    pub.restart()
    pub.drop_next(6)  # the new engine's seq 0-5: buffered, never seen live
    for h in range(6):
        pub.publish([vllm_stored([100 + h])])
    pub.publish([vllm_stored([106])])  # seq 6: looks like a gap 3-5 of the old engine
    wait_until(lambda: session.status().batches == 10)
    status = session.stop()
    assert (status.restarts, status.lost_batches, status.recovered_batches) == (1, 0, 6)
    ops = _rows(db, "SELECT op, block_hashes FROM watch_blocks ORDER BY rowid")
    assert ops == [(OP_STORED, f"[{10 + h}]") for h in range(3)] + [(OP_RESET, None)] + [
        (OP_STORED, f"[{100 + h}]") for h in range(7)
    ]
    (stats,) = q.block_stats(db, session.run_id)
    assert stats.resets == 1 and stats.cached == {"GPU": 7}  # only the new engine's


def test_a_replay_does_not_hold_up_the_other_sources(
    tmp_path: Path, publishers, monkeypatch
) -> None:
    """A gap is fetched on its own thread: while one source's replay endpoint is
    silent, the others' batches are delivered; the gap's own later batches wait."""
    import zmq

    import kvscope.profiler.watch.subscriber as sub

    monkeypatch.setattr(sub, "REPLAY_TIMEOUT_S", 5.0)
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # a replay endpoint that never answers
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    slow, other = publishers(), publishers()
    specs = expand_sources(slow.endpoint, replay=f"tcp://127.0.0.1:{port}") + expand_sources(
        other.endpoint
    )
    session = _session(tmp_path / "w.db", specs)
    for pub in (slow, other):
        pub.wait_for_subscribers()
    slow.publish([vllm_stored([1])])
    wait_until(lambda: session.status().batches == 1)
    slow.drop_next(2)
    for h in range(2, 6):
        slow.publish([vllm_stored([h])])  # seq 1-2 dropped, 3 shows the gap, 4 waits
    wait_until(lambda: session.subscriber.streams[0].replaying is not None)
    for h in range(3):
        other.publish([vllm_stored([100 + h])])
    wait_until(lambda: session.subscriber.streams[1].batches == 3)
    assert session.subscriber.streams[0].replaying is not None  # still waiting on it
    wait_until(lambda: session.status().batches == 6, timeout_s=30)  # 1 + 3 + the 2 behind
    status = session.stop()
    silent.close(0)
    assert (status.gaps, status.lost_batches) == (1, 2)
    rows = _rows(tmp_path / "w.db", "SELECT seq FROM watch_blocks WHERE source = 0 ORDER BY rowid")
    assert rows == [(0,), (3,), (4,)]  # in order, after the gap


def test_a_dead_writer_process_fails_the_run_and_keeps_what_it_wrote(
    tmp_path: Path, publishers
) -> None:
    pub = publishers()
    db = tmp_path / "w.db"
    session = _session(db, expand_sources(pub.endpoint), writer_process=True)
    pub.wait_for_subscribers()
    pub.publish([vllm_stored([1, 2])])
    wait_until(lambda: session.status().rows_written == 1)
    session.recorder._writer._proc.kill()  # as the OOM killer would
    pub.publish([vllm_stored([3])])
    wait_until(lambda: session.error is not None)
    assert "writer process died" in str(session.error)
    session.stop()
    assert _rows(db, "SELECT status FROM runs") == [("failed",)]
    (stats,) = q.block_stats(db, session.run_id)  # readable, and consistent with its raw rows
    assert stats.stored == 2 and _rows(db, "SELECT COUNT(*) FROM watch_blocks") == [(1,)]


_WATCHER = """
import sys, time
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import expand_sources
session = WatchSession(sys.argv[1], expand_sources(sys.argv[2]), writer_process=True).start()
print(session.recorder._writer._proc.pid, flush=True)
time.sleep(600)
"""


def _watcher(db: Path, endpoint: str):
    """``kvscope watch`` of ``endpoint`` into ``db`` as a process of its own, as a user
    runs it: (that process, its writer process's pid)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, str(db), endpoint],
        cwd=root, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, int(proc.stdout.readline())


def test_a_dead_watching_process_leaves_its_run_failed_and_resumable(
    tmp_path: Path, publishers
) -> None:
    """kill -9 of kvscope watch: its writer process sees the pipe close, marks the run
    failed (a later watch of the same sources resumes it) and exits."""
    import signal

    pub = publishers()
    db = tmp_path / "w.db"
    proc, child = _watcher(db, pub.endpoint)
    pub.wait_for_subscribers()
    pub.publish([vllm_stored([1, 2])])
    wait_until(lambda: _rows(db, "SELECT COUNT(*) FROM watch_blocks") == [(1,)], timeout_s=20)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    wait_until(lambda: _rows(db, "SELECT status FROM runs") == [("failed",)], timeout_s=20)

    def gone() -> bool:  # exited (a zombie, until something reaps it, is gone too)
        try:
            return Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] == "Z"
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True

    wait_until(gone, timeout_s=20)
    (stats,) = q.block_stats(db, 1)
    assert stats.stored == 2


def test_a_watching_process_killed_mid_burst_leaves_its_run_failed_and_no_slots(
    tmp_path: Path, publishers
) -> None:
    """kill -9 of kvscope watch while its writer process is busy with a burst's chunks
    (handed over in shared memory): the writer's next answer finds the pipe closed,
    and it marks the run failed and unlinks the slots, as when it sees the pipe close
    between writes. (Before, its answer's broken pipe ended it with the run left
    'running', which a later watch does not resume.)"""
    import signal

    shm = Path("/dev/shm")
    before = set(shm.iterdir()) if shm.is_dir() else set()
    pub = publishers()
    db = tmp_path / "w.db"
    proc, _ = _watcher(db, pub.endpoint)
    pub.wait_for_subscribers()
    for i in range(20_000):
        pub.publish([vllm_stored(list(range(16 * i + 1, 16 * i + 17)))])
    wait_until(lambda: _rows(db, "SELECT COUNT(*) FROM watch_blocks")[0][0] > 2000, timeout_s=30)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_until(lambda: _rows(db, "SELECT status FROM runs") == [("failed",)], timeout_s=30)
    (stats,) = q.block_stats(db, 1)
    written = _rows(db, "SELECT COUNT(*) FROM watch_blocks")[0][0]
    assert stats.stored == 16 * written < 16 * 20_000  # the aggregates are the rows'
    if shm.is_dir():
        wait_until(lambda: set(shm.iterdir()) <= before, timeout_s=20)


def test_every_front_end_counts_the_same_block_events(tmp_path: Path, publishers, capsys) -> None:
    """The live line had said 111,274 block events where `kvscope runs` said 58,843
    (rows written): one count, the sources' block events, everywhere."""
    from kvscope.app.cli import main
    from kvscope.app.commands.watch import _line
    from kvscope.db.queries import list_runs
    from kvscope.db.watch_snapshot import watch_snapshot

    pub = publishers()
    db = tmp_path / "w.db"
    session = _session(db, expand_sources(pub.endpoint))
    pub.wait_for_subscribers()
    for k in range(20):
        pub.publish([vllm_stored([100 * k + j for j in range(6)]), vllm_removed([100 * k])])
    wait_until(lambda: session.status().batches == 20)
    status = session.stop()
    assert status.block_events == 20 * 7
    (run,) = list_runs(db)
    assert run.block_events == run.events == status.block_events != run.events_written
    snap = watch_snapshot(db, run.run_id)
    assert sum(s.block_events for s in snap.sources) == status.block_events
    assert f"{status.block_events:,} block events" in _line(status)
    assert main(["runs", str(db)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    events = header.split().index("EVENTS")
    # STARTED and DURATION are two words each
    assert row.split()[events + 2] == str(status.block_events)
