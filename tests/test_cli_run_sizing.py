"""``kvscope run`` sizes its KV budget to the workload, but never for a prompt the context refuses;
the progress helper's lines (loading, ETA)."""

from __future__ import annotations

import io

import pytest

import kvscope.engine.engine as engine_module
from kvscope.app.commands.run import FIT_LONGEST, workload_kv_bytes
from kvscope.app.progress import Progress, duration_text, loading_model
from kvscope.app.workloads import WorkItem
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import KvscopeError
from kvscope.engine.sizing import pool_pages
from kvscope.engine.tiny import tiny_loaded

CONTEXT = 512  # the tiny model's


def tiny_engine() -> Engine:
    return Engine(EngineConfig(kv_budget_bytes=1 << 20, page_size=16), loaded=tiny_loaded())


def test_a_prompt_longer_than_the_context_does_not_grow_the_budget():
    engine = tiny_engine()
    short = WorkItem(" ".join(["t1"] * 40), max_tokens=8, chat=False)
    too_long = WorkItem(" ".join(["t1"] * (CONTEXT + 10)), max_tokens=8, chat=False)
    per_page = 16 * engine.bytes_per_token
    assert workload_kv_bytes(engine, [short]) == FIT_LONGEST * 3 * per_page  # 48 tokens: 3 pages
    assert workload_kv_bytes(engine, [short, too_long]) == workload_kv_bytes(engine, [short])
    assert workload_kv_bytes(engine, [too_long]) == 0
    absurd = WorkItem(" ".join(["t1"] * 40), max_tokens=10**9, chat=False)
    assert workload_kv_bytes(engine, [absurd]) == FIT_LONGEST * CONTEXT * engine.bytes_per_token


def test_progress_lines_say_how_far_and_how_long():
    out = io.StringIO()
    progress = Progress(4, "cases", stream=out, every_s=0.0)
    progress.started -= 30  # as if the first case took 30 s
    progress.advance()
    assert out.getvalue().splitlines()[-1] == "[kvscope] 1/4 cases, 30 s, ETA 1 min 30 s"
    progress.advance(3)
    assert out.getvalue().splitlines()[-1].startswith("[kvscope] 4/4 cases, 30 s")
    assert "ETA" not in out.getvalue().splitlines()[-1]
    assert duration_text(7300) == "2 h 1 min"
    with loading_model("x.gguf", stream=out):
        pass
    assert "[kvscope] loading model x.gguf ..." in out.getvalue()
    assert "[kvscope] model loaded in " in out.getvalue()


def test_infllm_host_tier_holds_the_distant_context_unless_given():
    from kvscope.app.cli import build_parser
    from kvscope.app.engine_options import engine_config_from_args

    parser = build_parser()

    def config(*flags: str):
        return engine_config_from_args(parser.parse_args(["generate", "x", *flags]))

    assert config("--kv-budget", "2GiB").host_budget_bytes == 256 << 20  # full attention
    infllm = ("--kv-budget", "2GiB", "--attention-mode", "infllm")
    assert config(*infllm).host_budget_bytes == 2 << 30
    assert config(*infllm, "--host-budget", "64MiB").host_budget_bytes == 64 << 20


def test_the_engine_refuses_a_pool_under_two_pages_by_the_shared_rule(monkeypatch):
    """The engine sizes its pool with ``pool_pages``, the rule ``info`` and the checks
    before a model load use, so the refusal cannot drift from theirs."""
    calls = []

    def spy(*args):
        calls.append(args)
        return pool_pages(*args)

    monkeypatch.setattr(engine_module, "pool_pages", spy)
    assert tiny_engine().num_pages == (1 << 20) // (16 * calls[0][1])
    # 2 layers x 2 KV heads x 8 x 2 (K and V) x 4 bytes (fp32) = 256 bytes per token
    with pytest.raises(KvscopeError) as refused:
        Engine(EngineConfig(kv_budget_bytes=4000, page_size=16), loaded=tiny_loaded())
    assert str(refused.value) == (
        "KV budget of 4000 bytes holds 0 pages of 4096 bytes; raise --kv-budget"
    )
    assert len(calls) == 2
