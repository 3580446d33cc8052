"""Shared fixtures: the real model loaded once, and the transformers oracle loaded once.

Loading transformers' GGUF path costs about half a minute here, so everything
that compares against it shares one session-scoped instance.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The Triton kernels run on the CPU through the interpreter, which must be
# chosen before triton is first imported; auto backend selection still picks
# torch on the CPU, so only tests that ask for Triton get it.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI replays a fixed set of examples so a landing never depends on luck; locally
# every run explores new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def loaded():
    from kvscope.engine.loader import load_model

    return load_model()


@pytest.fixture(scope="session")
def make_engine(loaded):
    """Build engines that share the loaded weights (each has its own KV cache)."""
    from kvscope.engine.engine import Engine
    from kvscope.engine.engine_config import EngineConfig

    def build(**overrides):
        return Engine(EngineConfig(**overrides), loaded=loaded)

    return build


@pytest.fixture(scope="session")
def oracle(loaded):
    """transformers' model on the same GGUF file: the reference for greedy output."""
    import torch
    from transformers import AutoModelForCausalLM

    from kvscope.engine.loader import default_model_path

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model.eval()
    return model


@pytest.fixture(scope="session")
def synthetic_db(tmp_path_factory):
    """(db path, run id, SyntheticRun): a recorded run with known contents, with
    offload, preemptions and GPU samples (dashboard and report tests)."""
    from kvscope.app.dashboard.screenshots import DEMO_CONFIG
    from kvscope.profiler.synthetic import record_synthetic

    path = tmp_path_factory.mktemp("synthetic") / "known.db"
    run_id, run = record_synthetic(
        path, DEMO_CONFIG, num_requests=60, num_pages=48, gpu=True, offload=True, seed=3
    )
    return path, run_id, run


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (Playwright's sync API allows one at a time);
    skipped, with the reason, only where Debian's chromium is absent."""
    from kvscope.app.dashboard.screenshots import CHROMIUM, launch

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()
