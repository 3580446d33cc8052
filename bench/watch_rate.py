"""How fast ``kvscope watch`` records: block events/s from many engines, zero loss.

``--sources`` synthetic publishers (default 64), framed exactly as vLLM's
ZmqEventPublisher with a replay buffer each, run in a separate process and
send ``--batches`` batches each as fast as they can over loopback TCP. Each
batch holds ``--stored`` BlockStored events of ``--blocks`` hashes (about half
of them >= 2^63, as vLLM's are) and as many BlockRemoved events.

Two measurements in the same run:

- baseline: a bare SUB loop that only receives the frames (what ZMQ and
  Python deliver here, nothing decoded or written);
- watch: a full WatchSession (decode, sequence tracking, replay of any gap,
  rows, SQLite) until every batch is committed; the check that nothing was
  lost compares the database's row count with what was sent.

Prints block events/s for both, their ratio, gaps/replays/lost batches, the
CPU seconds each part took while recording (the watching process's subscriber
and recorder threads, the writer process, and the publishing process, which
shares these two cores) and the peak RSS.

    .venv/bin/python bench/watch_rate.py [--sources 64] [--batches 200] [--blocks 16] [--stored 3]
        [--workload synthetic|fleet] [--events 1200000]
        [--writer process|thread] [--stages] [--repeats 1]

``--workload fleet`` publishes ``bench/watch_long.py``'s fleet instead (``--events``
block events of 8 ranks: parent-chained prefills under system prompts every rank
shares, multi-turn sessions, LRU eviction, resets), the stream a fleet sends: its
chains hang under others, so the writer's folding walks the tree.

``--repeats N`` runs the watch N times (the baseline once) and prints each run's
rate, then their median and range: on this 2-core machine one run's rate
spreads by about +-10 % from one run to the next.

``--stages`` times decoding, rows, their handover (marshal), inserts and folding
apart instead (CPU seconds, one thread, no sockets): what each costs, whatever
the machine's load;
and what the fold keeps at the end (removals remembered and forgotten, prefix
tree nodes), bounded by the fleet-wide budgets however long the session.
"""

from __future__ import annotations

import argparse
import gc
import marshal
import multiprocessing as mp
import os
import random
import resource
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (sets the import path)
import msgpack
import watch_long
import zmq

from kvscope.app.progress import Progress
from kvscope.db.watch_schema import OP_REMOVED, OP_STORED
from kvscope.profiler.watch.publisher import EventPublisher
from kvscope.profiler.watch.session import WatchSession
from kvscope.profiler.watch.sources import expand_sources

FLUSH_AT = 2000  # batches a transaction: the recorder's flush_at


def _stored(hashes: list[int], parent: int | None) -> dict:
    """A BlockStored as vLLM sends it (unsigned hashes)."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": [],
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def _payloads(pub: EventPublisher, rng: random.Random, args: argparse.Namespace) -> list[bytes]:
    out = []
    for _ in range(args.batches):
        events = []
        for _ in range(args.stored):
            hashes = [rng.getrandbits(64) for _ in range(args.blocks)]
            events.append(_stored(hashes, None))
            events.append({"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"})
        out.append(pub.encode(events))
    return out


def _sources(args: argparse.Namespace) -> int:
    return watch_long.RANKS if args.workload == "fleet" else args.sources


def _schedule(args: argparse.Namespace, pubs: list) -> tuple[list[tuple[int, bytes]], int]:
    """(source, payload) in the order they are published, and their block events.

    ``synthetic``: each source's ``--batches`` batches, round-robin, as engines stepping
    side by side would. ``fleet``: ``--events`` block events of ``bench/watch_long.py``'s
    fleet (8 ranks, parent-chained prefills, system prompts shared by every rank,
    multi-turn sessions, LRU eviction, prefix-cache resets) in its order, each batch
    at its time in the fleet's hour from now."""
    if args.workload == "synthetic":
        rng = random.Random(7)
        per_source = [_payloads(p, rng, args) for p in pubs]
        order = [(s, per_source[s][i]) for i in range(args.batches) for s in range(len(pubs))]
        return order, len(order) * 2 * args.stored * args.blocks
    unsigned = (1 << 64) - 1  # the fleet keeps hashes signed, as SQLite does
    order, block_events, now = [], 0, time.time()
    for rank, _seq, ts_s, events in watch_long.Fleet().batches(args.events):
        wire = []
        for op, hashes, parent in events:
            block_events += len(hashes)
            if op == OP_STORED:
                up = None if parent is None else parent & unsigned
                wire.append(_stored([h & unsigned for h in hashes], up))
            elif op == OP_REMOVED:
                wire.append({"type": "BlockRemoved", "block_hashes": [h & unsigned for h in hashes],
                             "medium": "GPU"})  # fmt: skip
            else:
                wire.append({"type": "AllBlocksCleared"})
        order.append((rank, pubs[rank].encode(wire, now + ts_s)))
    return order, block_events


def _publish(args: argparse.Namespace, ports: mp.Queue, go: mp.Event, subscribers: int) -> None:
    ctx = zmq.Context()
    pubs = [
        EventPublisher(
            "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", dp_rank=0, context=ctx
        )
        for _ in range(_sources(args))
    ]
    order, block_events = _schedule(args, pubs)
    ports.put(([(p.endpoint, p.replay_endpoint) for p in pubs], len(order), block_events))
    for pub in pubs:
        pub.wait_for_subscribers(subscribers, timeout_s=60)
    go.wait()
    for source, payload in order:
        pubs[source].publish_payload(payload)
    time.sleep(60)  # keep the replay buffers up until the parent is done


def _start_publishers(args: argparse.Namespace, subscribers: int):
    """The publishing process, its (endpoint, replay endpoint)s, the event that starts
    it, and the batches and block events it will send."""
    ctx = mp.get_context("spawn")
    ports, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_publish, args=(args, ports, go, subscribers), daemon=True)
    proc.start()
    endpoints, batches, block_events = ports.get(timeout=300)
    return proc, endpoints, go, batches, block_events


def baseline(args: argparse.Namespace) -> tuple[float, int, int]:
    """Block events/s a bare SUB receives (no decoding, no database), and the batches
    and block events the workload sends."""
    proc, endpoints, go, total, block_events = _start_publishers(args, 1)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1_000_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    for endpoint, _ in endpoints:
        sub.connect(endpoint)
    time.sleep(0.5)
    go.set()
    got = 0
    sub.recv_multipart()
    start = time.perf_counter()
    got = 1
    while got < total:
        sub.recv_multipart()
        got += 1
    elapsed = time.perf_counter() - start
    sub.close(0)
    ctx.term()
    proc.kill()
    return block_events * (total - 1) / total / elapsed, total, block_events


def _cpu_s(pid: int, task: int | None = None) -> float:
    """CPU seconds (user + system) of process ``pid`` (or of its thread ``task``)."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        stat = Path(path).read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_parts(session: WatchSession, publishers: int) -> dict[str, float]:
    """CPU seconds so far: the subscriber and recorder threads, the rest of the watching
    process, the writer process (when there is one) and the publishing process (pid
    ``publishers``: on these two cores it takes its share too)."""
    pid = os.getpid()
    sub = _cpu_s(pid, session.subscriber._thread.native_id)
    rec = _cpu_s(pid, session.recorder._thread.native_id)
    parts = {"subscriber": sub, "recorder": rec, "rest": _cpu_s(pid) - sub - rec}
    child = getattr(session.recorder._writer, "_proc", None)
    if child is not None and child.pid is not None:
        parts["writer process"] = _cpu_s(child.pid)
    parts["publishers"] = _cpu_s(publishers)
    return parts


def _peak_mib(proc: mp.Process | None) -> float | None:
    """A child process's peak RSS so far (VmHWM), while it runs."""
    if proc is None or proc.pid is None:
        return None
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
    except OSError:
        return None
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
    return None if line is None else int(line.split()[1]) / 1024


def watch(args: argparse.Namespace, db: Path) -> dict:
    proc, endpoints, go, total, block_events = _start_publishers(args, 1)
    specs = [s for e, r in endpoints for s in expand_sources(e, replay=r)]
    # As kvscope watch runs: a process of its own, and (unless --writer thread) the
    # writer in a process of its own.
    session = WatchSession(
        db, specs, freeze_gc=True, writer_process=args.writer == "process"
    ).start()
    time.sleep(0.5)
    go.set()
    while session.status().batches == 0:
        time.sleep(0.001)
    start = time.perf_counter()
    cpu_before = _cpu_parts(session, proc.pid)
    # Batches recorded so far, updated about once a second: the baseline takes a
    # fraction of the time, so this is the part worth an ETA.
    progress, shown, next_update = Progress(total, "batches recorded"), 0, start + 1.0
    while True:
        status = session.status()
        if status.batches + status.lost_batches >= total and status.queued == 0:
            break
        if time.perf_counter() >= next_update:
            done = min(total - 1, status.batches + status.lost_batches)
            progress.advance(done - shown)
            shown, next_update = done, time.perf_counter() + 1.0
        time.sleep(0.005)
    progress.advance(total - shown)
    # Before stop, which ends the threads and the writer process: it writes the last
    # batch or two after this, the CPU seconds leave that out.
    cpu = {k: v - cpu_before[k] for k, v in _cpu_parts(session, proc.pid).items()}
    writer_mib = _peak_mib(getattr(session.recorder._writer, "_proc", None))
    status = session.stop()
    elapsed = time.perf_counter() - start
    # The last chunk's commit (the child's clock: perf_counter is system-wide here): every
    # block event is in the file then; what stop does after it is closing (the file's
    # final WAL checkpoint, the sockets, the writer process's exit).
    committed = session.recorder._writer.committed_at
    proc.kill()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT SUM(blocks) FROM watch_blocks").fetchone()[0]
    conn.close()
    return {
        "rate": status.block_events / elapsed,
        "to_commit": None if committed is None else committed - start,
        # block events/s to the last commit
        "commit_rate": None if committed is None else block_events / (committed - start),
        "rows": rows,
        "expected": block_events,
        "gaps": status.gaps,
        "recovered": status.recovered_batches,
        "lost": status.lost_batches,
        "cpu": cpu,
        "elapsed": elapsed,
        "writer_mib": writer_mib,
    }


class _Encoder:
    """``_payloads``' publisher, without sockets: ``--stages`` publishes nothing."""

    def encode(self, events: list, ts: float | None = None) -> bytes:
        return msgpack.packb([time.time() if ts is None else ts, events, 0])


def stages(args: argparse.Namespace) -> None:
    """CPU seconds of each stage of recording, timed apart on the same batches in one
    thread with no sockets: decoding and rows a flush (``flush_at`` batches) at a time
    as the watching process makes them, with its collector settings; their handover
    (marshal, as to the writer process); SQLite inserts and folding into the
    aggregates (with their writes, a transaction per flush) with the writer
    process's collector settings."""
    from kvscope.db.store import open_db
    from kvscope.db.watch_aggregates import write_aggregates
    from kvscope.db.watch_batch import WatchBatch, insert_statement, unpack_hashes
    from kvscope.db.watch_schema import BLOCK_COLUMNS
    from kvscope.db.writer import create_run
    from kvscope.profiler.watch.rows import SourceAttrs, batch_rows
    from kvscope.profiler.watch.wire import decode_batch
    from kvscope.profiler.watch.writer import WatchWriter

    schedule, n = _schedule(args, [_Encoder() for _ in range(_sources(args))])
    seqs = [0] * _sources(args)
    order = []
    for s, payload in schedule:
        order.append((s, seqs[s], payload))
        seqs[s] += 1
    gc.set_threshold(500_000, 10, 10)  # as the watching process runs (WatchRecorder)
    gc.freeze()  # the payloads: sent, in a watch, not held
    clock = time.process_time
    fields = tuple(WatchBatch.__dataclass_fields__)

    def flushes(keep: bool) -> tuple[float, float, float, list]:
        """Decode, rows and handover a flush at a time; the rows kept (for the stages
        below) or, as in a watch, let go after the handover: the timed pass keeps
        nothing, since a heap growing by every row is not what a watch's is."""
        attrs = {s: SourceAttrs() for s in range(_sources(args))}
        chunks = []
        decode_s = rows_s = marshal_s = 0.0
        for k in range(0, len(order), FLUSH_AT):
            t = clock()
            decoded = [(s, i, decode_batch(payload)) for s, i, payload in order[k : k + FLUSH_AT]]
            t2 = clock()
            blocks: list[tuple] = []
            hash_lists: list = []
            for s, i, batch in decoded:
                batch_rows(s, i, 1_000_000_000 + i, batch, attrs[s], blocks, [], hash_lists)
            del decoded  # as the recorder lets go of its batches before the handover
            t4 = clock()
            handed = WatchBatch(blocks=blocks, hash_lists=hash_lists)
            marshal.dumps(("write", tuple(getattr(handed, f) for f in fields), 0))
            t5 = clock()
            # Letting go of the batches is the recorder's too: with the rows.
            decode_s, rows_s = decode_s + t2 - t, rows_s + t4 - t2
            marshal_s += t5 - t4
            if keep:
                chunks.append((blocks, hash_lists))
        return decode_s, rows_s, marshal_s, chunks

    decode_s, rows_s, marshal_s, _ = flushes(keep=False)
    chunks = flushes(keep=True)[3]
    gc.set_threshold(500_000, 10, 10)  # as the writer process runs
    with tempfile.TemporaryDirectory() as tmp:
        db = open_db(Path(tmp) / "stages.db")
        run_id = create_run(
            db, kind="watch", model=None, config={}, hardware={}, versions={},
            started_at=time.time(), start_ns=0,
        )  # fmt: skip
        writer = WatchWriter(db, run_id)
        sql = insert_statement("watch_blocks", BLOCK_COLUMNS, run_id)
        t = clock()  # the usual batch's hashes come packed: their lists, as the writer folds them
        chunks = [(blocks, unpack_hashes(hash_lists)) for blocks, hash_lists in chunks]
        unpack_s = clock() - t
        t = clock()
        for blocks, _ in chunks:
            with db.atomic():
                db.conn.executemany(sql, blocks)
        insert_s = clock() - t
        state = writer.state
        sources = [
            (s, "events", "vllm", f"tcp://h:{s}", None, "", 0, 0) for s in range(_sources(args))
        ]
        writer.write(WatchBatch(sources=sources))
        t = clock()
        for blocks, hash_lists in chunks:
            with db.atomic():
                state.apply(blocks, hash_lists)
                write_aggregates(db.conn, run_id, state.changes())
            gc.freeze()
        fold_s = clock() - t
        db.conn.close()
    print(f"{n:,} block events, CPU s: decode {decode_s:.3f}, rows {rows_s:.3f}, "
          f"marshal {marshal_s:.3f}, unpack {unpack_s:.3f}, inserts {insert_s:.3f}, "
          f"folding {fold_s:.3f} "
          f"({n / fold_s / 1e6:.2f} M/s)")  # fmt: skip
    # What the fold keeps at the end: bounded, whatever the session's length.
    remembered = sum(len(s.evicted) for s in state.sources.values())
    forgotten = sum(getattr(s, "forgotten", 0) for s in state.sources.values())
    nodes = sum(len(t.nodes) for t in state.trees.values())
    print(f"fold state: {remembered:,} removals remembered, {forgotten:,} forgotten; "
          f"prefix tree {nodes:,} nodes")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=64)
    parser.add_argument("--batches", type=int, default=200, help="batches per source")
    parser.add_argument("--blocks", type=int, default=16, help="hashes per event")
    parser.add_argument("--stored", type=int, default=3, help="BlockStored events per batch")
    parser.add_argument(
        "--workload", choices=("synthetic", "fleet"), default="synthetic",
        help="synthetic: the batches above; fleet: bench/watch_long.py's fleet of 8 ranks",
    )  # fmt: skip
    parser.add_argument(
        "--events", type=int, default=1_200_000, help="block events of --workload fleet"
    )
    parser.add_argument(
        "--writer", choices=("process", "thread"), default="process",
        help="where the watch writes from (kvscope watch: a process of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--stages", action="store_true", help="only the CPU seconds of each stage, timed apart"
    )
    parser.add_argument(
        "--repeats", type=int, default=1,
        help="watch runs (each with fresh publishers and file): their median and range, "
        "since a 2-core machine's runs spread by +-10%%",
    )  # fmt: skip
    args = parser.parse_args()
    if args.stages:
        stages(args)
        return
    base, batches, block_events = baseline(args)
    runs = []
    for i in range(max(1, args.repeats)):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(watch(args, Path(tmp) / "watch.db"))
        if args.repeats > 1:
            r = runs[-1]
            last = "" if not r["commit_rate"] else f", {r['commit_rate']:,.0f} to the last commit"
            print(f"run {i + 1}: {r['rate']:,.0f} block events/s recorded{last}")
    result = runs[-1]
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.workload == "fleet":
        print(
            f"fleet of {watch_long.RANKS} ranks: {batches:,} batches, {block_events:,} block events"
        )
    else:
        print(f"{args.sources} sources x {args.batches} batches x "
              f"{block_events // batches} block events")  # fmt: skip
    print(f"baseline (receive only): {base:,.0f} block events/s")
    if len(runs) > 1:
        rates = [r["rate"] for r in runs]
        commits = [r["commit_rate"] for r in runs if r["commit_rate"]]
        print(f"kvscope watch (recorded), median of {len(runs)}: {statistics.median(rates):,.0f} "
              f"block events/s ({min(rates):,.0f}-{max(rates):,.0f}; "
              f"{statistics.median(rates) / base:.2f}x the baseline)")  # fmt: skip
        if commits:
            print(f"  to the last commit, median: {statistics.median(commits):,.0f} block events/s "
                  f"({min(commits):,.0f}-{max(commits):,.0f})")  # fmt: skip
        print("the last run in detail:")
    print(f"kvscope watch (recorded): {result['rate']:,.0f} block events/s "
          f"({result['rate'] / base:.2f}x the baseline)")  # fmt: skip
    if result["to_commit"]:
        closing = result["elapsed"] - result["to_commit"]
        print(f"  to the last commit: {result['commit_rate']:,.0f} block "
              f"events/s; closing after it (final WAL checkpoint, sockets, writer exit) "
              f"{closing * 1e3:.0f} ms")  # fmt: skip
    print(
        f"rows {result['rows']:,} of {result['expected']:,} sent; gaps {result['gaps']}, "
        f"replayed {result['recovered']} batches, lost {result['lost']}"
    )
    cpu = ", ".join(f"{name} {s:.2f}" for name, s in result["cpu"].items())
    print(
        f"CPU s while recording ({result['elapsed']:.2f} s, the last write or two left out): {cpu}"
    )
    writer = (
        ""
        if result["writer_mib"] is None
        else f", of its writer process {result['writer_mib']:,.0f} MiB"
    )
    print(f"peak RSS of the watching process: {peak_mib:,.0f} MiB{writer}")
    if any(r["rows"] != r["expected"] for r in runs):
        raise SystemExit("LOSS: the database does not hold every block event sent")


if __name__ == "__main__":
    main()
