"""A KV-event publisher that frames messages exactly as vLLM's ZmqEventPublisher.

For tests, benchmarks and demos of ``kvscope watch`` without an engine: live
messages are topic / 8-byte big-endian seq / msgpack payload, every batch is
kept in a bounded replay buffer served over a ROUTER socket (3-frame replies
with the topic as in vLLM >= 0.26, or 2-frame ones as before), ending with
seq -1. It publishes on an XPUB socket, which a subscriber cannot tell from a
PUB, so that ``wait_for_subscribers`` can tell when a subscription has arrived
(ZMQ drops what a PUB sends before that). ``drop_next`` and ``restart`` make
the gaps and restarts a real engine causes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import msgpack
import zmq

from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.wire import REPLAY_END, pack_seq


def vllm_block_stored(
    hashes: list[int], parent: int | None = None, *, block_size: int = 16, medium: str = "GPU"
) -> dict[str, Any]:
    """vLLM >= 0.24's BlockStored: a map with the fields without defaults always present."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(block_size * len(hashes))),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def vllm_block_removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    """vLLM >= 0.24's BlockRemoved."""
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": 0}


def _binds(endpoint: str) -> bool:
    """vLLM's rule: bind for wildcards and ipc/inproc, connect otherwise."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class EventPublisher:
    """One engine's event stream. ``endpoint`` as in vLLM's ``--kv-events-config``."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        replay_frames: int = 3,
        dp_rank: int | None = None,
        batch_length: int = 3,
        context: zmq.Context | None = None,
    ) -> None:
        if replay_frames not in (2, 3) or batch_length not in (2, 3):
            raise ValueError("replay_frames and batch_length must be 2 or 3")
        self._ctx = context or zmq.Context.instance()
        self.topic = topic.encode()
        self.dp_rank = dp_rank
        self.batch_length = batch_length
        self.replay_frames = replay_frames
        self.seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._drop = 0
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.LINGER, 1000)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        if _binds(endpoint):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode() or endpoint
        self._router: zmq.Socket | None = None
        self.replay_endpoint: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay_endpoint is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay_endpoint)
            self.replay_endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def wait_for_subscribers(self, n: int = 1, timeout_s: float = 10.0) -> None:
        """Block until ``n`` subscriptions have arrived."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while seen < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pub.poll(int(left * 1000)):
                raise KvscopeError(f"no subscriber on {self.endpoint} after {timeout_s} s")
            if self._pub.recv()[:1] == b"\x01":
                seen += 1

    def encode(self, events: list[Any], ts: float | None = None) -> bytes:
        """A batch's payload: ``[ts, events, dp_rank]`` (or without the rank)."""
        outer: list[Any] = [time.time() if ts is None else ts, events]
        if self.batch_length == 3:
            outer.append(self.dp_rank)
        return msgpack.packb(outer)

    def publish(self, events: list[Any], ts: float | None = None) -> int:
        """Send one batch (events already in wire shape); returns its seq."""
        return self.publish_payload(self.encode(events, ts))

    def publish_payload(self, payload: bytes) -> int:
        with self._lock:
            seq = self.seq
            self.seq += 1
            self._buffer.append((seq, payload))
            dropped = self._drop > 0
            if dropped:
                self._drop -= 1
        if not dropped:
            self._pub.send_multipart((self.topic, pack_seq(seq), payload), copy=False)
        return seq

    def drop_next(self, n: int) -> None:
        """Keep the next ``n`` batches in the replay buffer but do not send them."""
        self._drop = n

    def restart(self) -> None:
        """What an engine restart looks like: numbering from 0, an empty replay buffer."""
        with self._lock:
            self.seq = 0
            self._buffer.clear()

    def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while not self._stop.is_set():
            if not router.poll(50):
                continue
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            with self._lock:
                batches = [(s, p) for s, p in self._buffer if s >= first]
            for seq, payload in batches:
                router.send_multipart(self._reply(client, self.topic, pack_seq(seq), payload))
            router.send_multipart(self._reply(client, b"", pack_seq(REPLAY_END), b""))

    def _reply(self, client: bytes, topic: bytes, seq: bytes, payload: bytes) -> list[bytes]:
        if self.replay_frames == 3:
            return [client, b"", topic, seq, payload]
        return [client, b"", seq, payload]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._router is not None:
            self._router.close(0)
        self._pub.close()
