"""Attention backends and KV formats in the real engine.

The Triton kernels run under the interpreter (``TRITON_INTERPRET=1`` must be
set before triton is imported, so that run is a subprocess) and must give the
same greedy tokens as the torch path; every KV storage format generates.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from kvscope.engine.sampler import SamplingParams
from kvscope.engine.sizing import KV_DTYPES

from support.installed import KVSCOPE

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Water boils at"]


def _generate(backend: str, env: dict[str, str]) -> list[list[int]]:
    proc = subprocess.run(
        [
            KVSCOPE,
            "generate",
            *PROMPTS,
            "--max-tokens",
            "3",
            "--json",
            "--attention-backend",
            backend,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line)["token_ids"] for line in proc.stdout.splitlines()]


def test_triton_backend_matches_torch():
    torch_tokens = _generate("torch", {})
    triton_tokens = _generate("triton", {"TRITON_INTERPRET": "1"})
    assert triton_tokens == torch_tokens
    assert all(len(t) == 3 for t in torch_tokens)


def test_triton_without_cuda_refuses_clearly():
    proc = subprocess.run(
        [KVSCOPE, "generate", "hi", "--attention-backend", "triton"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
    )
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("[kvscope] ")]
    assert errors == [
        "kvscope: error: triton backend needs a CUDA device or TRITON_INTERPRET=1 set before "
        "triton is imported (tensors are on cpu)"
    ]


# Top-1 agreement with the fp32 cache over a 200-token text; e5m2 keeps 2 mantissa
# bits and int4 16 levels per group, so they are allowed to drift more.
MIN_TOP1 = {"fp16": 0.98, "bf16": 0.95, "fp8_e4m3": 0.9, "int8": 0.95, "fp8_e5m2": 0.8, "int4": 0.8}


@pytest.fixture(scope="module")
def text_ids(loaded):
    from kvscope.app.workloads import DOCUMENT, SYSTEM_PROMPT

    return loaded.codec.encode(SYSTEM_PROMPT + " " + DOCUMENT)[:200]


@pytest.fixture(scope="module")
def fp32_logits(make_engine, text_ids):
    return make_engine().score(text_ids, chunk=64)


@pytest.mark.parametrize("kv_dtype", [k for k in KV_DTYPES if k != "fp32"])
def test_every_kv_dtype_close_to_fp32(make_engine, kv_dtype, text_ids, fp32_logits):
    engine = make_engine(kv_dtype=kv_dtype)
    logits = engine.score(text_ids, chunk=64)
    assert not logits.isnan().any()
    top1 = (logits.argmax(-1) == fp32_logits.argmax(-1)).float().mean().item()
    assert top1 >= MIN_TOP1[kv_dtype]
    assert engine.storage.nbytes <= engine.kv_budget_bytes
    assert engine.num_pages > make_engine().num_pages  # same byte budget, more pages
    # a format that keeps something is never exactly fp32 (the cache really is quantized)
    assert not torch.equal(logits, fp32_logits)
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs)


@pytest.mark.parametrize("weights_dtype, min_top1", [("bf16", 0.9), ("int8", 0.85)])
def test_weight_formats_close_to_fp32(make_engine, weights_dtype, min_top1, text_ids, fp32_logits):
    engine = make_engine(weights_dtype=weights_dtype)
    logits = engine.score(text_ids, chunk=64)
    top1 = (logits.argmax(-1) == fp32_logits.argmax(-1)).float().mean().item()
    assert top1 >= min_top1
    assert not torch.equal(logits, fp32_logits)
    assert engine.model.weight_bytes < make_engine().model.weight_bytes
