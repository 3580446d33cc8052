"""Subscribes to engines' KV-event streams and hands every batch on, in order.

One background thread owns every ZMQ socket (ZMQ sockets are single-threaded):
a SUB per source (or one bound SUB for ``--listen`` fan-in), a monitor per SUB
for connects and disconnects, and a DEALER per replay endpoint. Each stream
(source, and for a listening socket each DP rank seen) has a sequence tracker:
a gap is filled from the replay buffer when there is one, what cannot be filled
is counted as lost, and a sequence going backwards resets the stream. kvscope
only ever reads, so it cannot slow an engine down unless it stops reading: when
the sink is full this thread waits, ZMQ drops at its high-water mark, and the
drop comes back as a gap.
"""

from __future__ import annotations

import logging
import queue
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.incident import IncidentNote
from kvscope.profiler.watch.sequence import SequenceTracker, Verdict
from kvscope.profiler.watch.sources import SourceSpec, offset_endpoint
from kvscope.profiler.watch.wire import (
    REPLAY_END,
    EventBatch,
    decode_batch,
    pack_seq,
    parse_live,
    parse_replay,
)

log = logging.getLogger(__name__)

RECV_HWM = 100_000  # batches ZMQ may hold for us before the publisher drops
REPLAY_TIMEOUT_S = 2.0
POLL_MS = 100


@dataclass(slots=True)
class Stream:
    """One engine's event stream and what happened on it so far."""

    index: int  # the source's number within the watch run
    spec: SourceSpec
    dp_rank: int | None
    topic: str
    tracker: SequenceTracker = field(default_factory=SequenceTracker)
    batches: int = 0
    events: int = 0
    gaps: int = 0
    recovered_batches: int = 0
    lost_batches: int = 0
    restarts: int = 0
    disconnects: int = 0
    connects: int = 0  # connections made (or, listening, accepted) on its socket
    last_ts: float | None = None  # the engine's timestamp on the last batch accepted
    replaying: _Replay | None = None  # a gap being fetched: live batches wait behind it
    bad_messages: int = 0


@dataclass(slots=True)
class _Replay:
    """One gap [first, end) being fetched on its own thread."""

    first: int
    end: int
    last: int | None  # the stream's last accepted seq and its timestamp, when it began
    last_ts: float | None
    pending: list[tuple[int, EventBatch | str]] = field(default_factory=list)  # live, after
    batches: list[tuple[int, EventBatch | str]] = field(default_factory=list)  # replayed
    restarted_ts: float | None = None  # set when the buffer showed an engine restart
    detail: str | None = None  # why nothing (or not all) came back


class Sink(Protocol):
    """Where streams' batches and incidents go (the watch recorder)."""

    def next_source_index(self) -> int: ...

    def source_index(self, spec: SourceSpec, dp_rank: int | None, topic: str) -> int: ...

    def new_stream(self, stream: Stream) -> None: ...

    def on_batch(self, stream: Stream, seq: int, batch: EventBatch) -> None: ...

    def on_restart(self, stream: Stream, last_seq: int | None, seq: int, ts: float) -> None:
        """The engine behind ``stream`` restarted before its batch stamped ``ts``."""

    def on_incident(self, stream: Stream, incident: IncidentNote) -> None: ...


@dataclass(slots=True)
class _Socket:
    """A SUB socket and the streams it carries: one, or when listening one per
    (topic, DP rank) of the engines that push to it; ``base`` is the socket's own."""

    spec: SourceSpec
    sub: zmq.Socket
    monitor: zmq.Socket
    base: Stream
    streams: dict[tuple[bytes, int | None], Stream]


class Subscriber:
    """Streams from ``specs`` into ``sink`` on a background thread until ``stop()``."""

    def __init__(self, specs: list[SourceSpec], sink: Sink) -> None:
        """No ``specs``: nothing to read (a scrape-only watch), and no thread started."""
        self._specs = specs
        self._sink = sink
        self._ctx = zmq.Context()
        _room_for(self._ctx, len(specs))
        self._sockets: list[_Socket] = []
        self._streams: list[Stream] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._replays: list[threading.Thread] = []
        self._replayed: queue.SimpleQueue[Stream] = queue.SimpleQueue()  # fetched, to deliver
        self.error: BaseException | None = None
        try:
            for spec in specs:
                self._sockets.append(self._open(spec))
        except KvscopeError:
            self._close()
            raise
        except zmq.ZMQError as exc:  # out of sockets or files: one line, not a hang
            self._close()
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            raise KvscopeError(
                f"cannot open the sockets of {len(specs)} sources: {exc} (this process may "
                f"open {soft} files; `ulimit -n` raises that)"
            ) from None

    @property
    def streams(self) -> list[Stream]:
        """Every stream seen, in order (kept after ``stop``)."""
        return list(self._streams)

    def _new_stream(self, spec: SourceSpec, dp_rank: int | None, topic: str) -> Stream:
        stream = Stream(self._sink.source_index(spec, dp_rank, topic), spec, dp_rank, topic)
        self._streams.append(stream)
        self._sink.new_stream(stream)
        return stream

    def _open(self, spec: SourceSpec) -> _Socket:
        sub = self._ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.RCVHWM, RECV_HWM)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, spec.topic.encode())
            monitor = sub.get_monitor_socket(
                zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
            )
        except zmq.ZMQError:
            sub.close(0)  # an open socket would hang the context's term in _close
            raise
        try:
            if spec.listen:
                sub.bind(spec.endpoint)
            else:
                sub.connect(spec.endpoint)
        except zmq.ZMQError as exc:
            sub.close(0)
            monitor.close(0)
            verb = "listen on" if spec.listen else "connect to"
            raise KvscopeError(f"cannot {verb} {spec.endpoint}: {exc}") from None
        stream = self._new_stream(spec, spec.dp_rank, spec.topic)
        return _Socket(spec, sub, monitor, stream, {(spec.topic.encode(), spec.dp_rank): stream})

    # --- the thread -------------------------------------------------------------

    def start(self) -> None:
        if not self._sockets:
            return
        self._thread = threading.Thread(target=self._run, name="kvscope-watch-sub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading and close every socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._close()

    def _close(self) -> None:
        for sock in self._sockets:
            sock.sub.disable_monitor()
            sock.monitor.close(0)
            sock.sub.close(0)
        self._sockets = []
        self._ctx.term()

    def _run(self) -> None:
        try:
            poller = zmq.Poller()
            owners: dict[zmq.Socket, tuple[_Socket, bool]] = {}
            for sock in self._sockets:
                poller.register(sock.sub, zmq.POLLIN)
                poller.register(sock.monitor, zmq.POLLIN)
                owners[sock.sub] = (sock, False)
                owners[sock.monitor] = (sock, True)
            while not self._stop.is_set():
                for socket, _ in poller.poll(POLL_MS):
                    sock, is_monitor = owners[socket]
                    if is_monitor:
                        self._on_monitor(sock)
                    else:
                        self._drain(sock)
                self._deliver_replays()
            # Stopping: the gaps being fetched finish (each within its timeout), and
            # what waited behind them is handed on before the recorder's last write.
            while self._replays:
                self._replays.pop().join()
                self._deliver_replays()
        except BaseException as exc:  # reported by the watch command, never silent
            self.error = exc
            log.exception("kvscope watch: subscriber stopped")

    def _drain(self, sock: _Socket) -> None:
        """Read what is queued on one SUB, up to a bound so other sources get their turn."""
        for _ in range(1000):
            try:
                frames = sock.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_frames(sock, frames)

    def _on_monitor(self, sock: _Socket) -> None:
        event = recv_monitor_message(sock.monitor)
        kind = event["event"]
        stream = sock.base
        if kind == zmq.EVENT_DISCONNECTED:
            stream.disconnects += 1
            self._sink.on_incident(
                stream, IncidentNote("disconnected", detail=_text(event["endpoint"]))
            )
        else:
            stream.connects += 1
            self._sink.on_incident(
                stream, IncidentNote("connected", detail=_text(event["endpoint"]))
            )

    def _stream_for(self, sock: _Socket, topic: bytes, batch: EventBatch) -> Stream:
        """The stream of a message: engines pushing to one listening socket are told
        apart by topic and DP rank (each numbers its batches from 0)."""
        if not sock.spec.listen:
            return sock.base
        key = (topic, sock.spec.dp_rank if batch.dp_rank is None else batch.dp_rank)
        stream = sock.streams.get(key)
        if stream is None:
            name = topic.decode(errors="replace")
            stream = sock.streams[key] = self._new_stream(sock.spec, key[1], name)
        return stream

    def _on_frames(self, sock: _Socket, frames: list[bytes]) -> None:
        base = sock.base
        try:
            message = parse_live(frames)
        except KvscopeError as exc:
            base.bad_messages += 1
            self._sink.on_incident(base, IncidentNote("bad_message", detail=str(exc)))
            return
        batch = _decode(message.payload)
        # An undecodable batch still takes its place in the sequence: it arrived.
        stream = (
            self._stream_for(sock, message.topic, batch) if isinstance(batch, EventBatch) else base
        )
        self._accept(stream, message.seq, batch)

    def _accept(self, stream: Stream, seq: int, batch: EventBatch | str) -> None:
        """A live batch in sequence order: delivered, or (behind a gap being
        replayed) kept until the gap's batches are in."""
        if stream.replaying is not None:
            stream.replaying.pending.append((seq, batch))
            return
        verdict = stream.tracker.classify(seq)
        if verdict is Verdict.DUPLICATE:
            return
        if verdict is Verdict.RESTART:
            stream.restarts += 1
            ts = batch.ts if isinstance(batch, EventBatch) else time.time()
            self._sink.on_restart(stream, stream.tracker.last, seq, ts)
            stream.tracker.reset()
            verdict = stream.tracker.classify(seq)
        if verdict is Verdict.GAP:
            self._start_replay(stream, stream.tracker.expected, seq, (seq, batch))
            return
        self._deliver(stream, seq, batch)

    def _deliver(self, stream: Stream, seq: int, batch: EventBatch | str) -> None:
        """Accept ``seq``: hand its batch on, or count it bad (``batch`` is then the error)."""
        stream.tracker.accept(seq)
        if isinstance(batch, str):
            stream.bad_messages += 1
            self._sink.on_incident(stream, IncidentNote("bad_message", seq, seq, detail=batch))
            return
        stream.batches += 1
        stream.events += len(batch.events)
        stream.last_ts = batch.ts
        self._sink.on_batch(stream, seq, batch)

    # --- replay -------------------------------------------------------------------

    def _start_replay(
        self, stream: Stream, first: int, end: int, live: tuple[int, EventBatch | str]
    ) -> None:
        """Fetch the batches [first, end) on a thread of their own, so the other
        sources are read meanwhile; ``live`` (and what follows) waits behind them."""
        stream.gaps += 1
        endpoint = stream.spec.replay
        if endpoint is not None and stream.dp_rank != stream.spec.dp_rank and stream.dp_rank:
            # A rank found in the payloads of a one-port listener: its replay port by the rule.
            endpoint = offset_endpoint(endpoint, stream.dp_rank)
        job = _Replay(first, end, stream.tracker.last, stream.last_ts, [live])
        stream.replaying = job
        if endpoint is None:
            job.detail = "no replay endpoint"
            self._replayed.put(stream)
            return
        thread = threading.Thread(
            target=self._fetch_gap, args=(stream, endpoint, job), name="kvscope-watch-replay",
            daemon=True,
        )  # fmt: skip
        self._replays.append(thread)
        thread.start()

    def _fetch_gap(self, stream: Stream, endpoint: str, job: _Replay) -> None:
        """The replay thread: only reads its own DEALER and fills ``job``."""
        try:
            try:
                job.batches = self._fetch(endpoint, job, job.first, check=True)
            except _Restarted as restarted:
                # The engine restarted and its new numbering overtook ours before
                # we saw it: what it sent since its restart is what is missing.
                job.restarted_ts = restarted.ts
                job.first = 0
                job.batches = self._fetch(endpoint, job, 0, check=False)
        except KvscopeError as exc:
            job.detail = str(exc)
        except Exception as exc:  # never leave the stream waiting behind a dead thread
            job.detail = f"replay failed: {exc}"
        finally:
            self._replayed.put(stream)

    def _fetch(
        self, endpoint: str, job: _Replay, first: int, *, check: bool
    ) -> list[tuple[int, EventBatch | str]]:
        """The buffered batches [first, job.end). With ``check``, also asks for the
        last batch accepted: when the buffer's batch of that number is not the one
        recorded (another timestamp), the engine restarted (``_Restarted``)."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(endpoint)
            last = job.last
            known = check and last is not None and last >= 0 and job.last_ts is not None
            dealer.send_multipart([b"", pack_seq(last if known else first)])
            out = []
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while True:
                if not dealer.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                    raise KvscopeError(f"replay from {endpoint} timed out")
                message = parse_replay(dealer.recv_multipart())
                if message.seq == REPLAY_END:
                    return out
                if known and message.seq == last:
                    replayed = _decode(message.payload)
                    if isinstance(replayed, EventBatch) and replayed.ts != job.last_ts:
                        raise _Restarted(job.last_ts)
                    continue
                # Only the missing range: later batches are still on their way live.
                if first <= message.seq < job.end:
                    out.append((message.seq, _decode(message.payload)))
        finally:
            dealer.close(0)

    def _deliver_replays(self) -> None:
        """Hand on the gaps fetched since the last call, then what waited behind them."""
        while True:
            try:
                stream = self._replayed.get_nowait()
            except queue.Empty:
                return
            job = stream.replaying
            stream.replaying = None
            if job is None:
                continue
            if job.restarted_ts is not None:
                stream.restarts += 1
                self._sink.on_restart(stream, stream.tracker.last, job.end, job.restarted_ts + 1e-6)
                stream.tracker.reset()
            got = 0
            for seq, batch in job.batches:
                if stream.tracker.expected <= seq < job.end:
                    self._deliver(stream, seq, batch)
                    got += 1
            wanted = job.end - job.first
            detail = job.detail or (None if got == wanted else "replay buffer no longer holds them")
            stream.recovered_batches += got
            stream.lost_batches += wanted - got
            self._sink.on_incident(
                stream, IncidentNote("gap", job.first, job.end - 1, got, wanted - got, detail)
            )
            # The batch that showed the gap is next now, whatever came back; those
            # behind it take their turn in order (and may show another gap).
            (seq, batch), *behind = job.pending
            self._deliver(stream, seq, batch)
            for seq, batch in behind:
                self._accept(stream, seq, batch)


class _Restarted(Exception):  # noqa: N818 (a signal between two methods, not an error)
    """The replay buffer's batch of our last sequence number is another one."""

    def __init__(self, ts: float) -> None:
        self.ts = ts  # the old engine's last batch: the reset goes right after it


def _room_for(ctx: zmq.Context, sources: int) -> None:
    """Sockets and files enough for ``sources``: a SUB and its monitor each (a few
    files apiece), and a DEALER per gap being fetched. ZMQ's default of 1023 sockets
    a context had stopped a watch of ~500 DP ranks with a traceback, then a hang."""
    wanted = 4 * sources + 64
    if wanted > ctx.get(zmq.MAX_SOCKETS):
        ctx.set(zmq.MAX_SOCKETS, min(wanted, ctx.get(zmq.SOCKET_LIMIT)))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = 4 * wanted
    if soft != resource.RLIM_INFINITY and soft < files:
        limit = files if hard == resource.RLIM_INFINITY else min(files, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, limit), hard))
        except (ValueError, OSError):  # not allowed here: the sockets' error says so
            pass


def _decode(payload: bytes) -> EventBatch | str:
    """The batch, or why it cannot be decoded."""
    try:
        return decode_batch(payload)
    except KvscopeError as exc:
        return str(exc)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
