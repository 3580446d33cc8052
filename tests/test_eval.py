"""``kvscope eval``: full vs InfLLM on the same inputs (tiny model), and the CLI end to end (real model)."""

from __future__ import annotations

import json

import pytest

from kvscope.app.cli import main
from kvscope.app.evals.compare import Comparison
from kvscope.app.evals.corpus import long_text_ids
from kvscope.app.evals.passkey import build_case
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.tiny import tiny_loaded

INFLLM = dict(
    page_size=4,
    kv_budget_bytes=1 << 20,
    max_batched_tokens=32,
    infllm_initial_tokens=8,
    infllm_local_tokens=16,
    infllm_block_pages=2,
)


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded(max_position=1024)


def test_passkey_case_has_the_length_and_the_key_at_its_depth():
    encode = lambda text: [ord(c) for c in text]  # noqa: E731 (one token per character)
    case = build_case(encode, 2000, 0.25)
    assert len(case.prompt_ids) == 2000
    text = "".join(map(chr, case.prompt_ids))
    at = text.index(f"The pass key is {case.key}.")
    assert 0.2 < at / 2000 < 0.3
    assert text.endswith("What is the pass key? The pass key is")
    assert build_case(encode, 2000, 0.25).key == case.key != build_case(encode, 2000, 0.75).key


def test_long_text_is_deterministic_and_exact_length():
    encode = lambda text: text.split()  # noqa: E731
    a, b = long_text_ids(encode, 500), long_text_ids(encode, 500)
    assert a == b and len(a) == 500
    assert long_text_ids(encode, 500, seed=1) != a
    assert len(set(a)) > 60  # varied words, not one sentence repeated


def test_every_block_retrieved_matches_full_attention(loaded):
    comparison = Comparison(EngineConfig(**INFLLM, infllm_topk_blocks=1000), loaded)
    full, infllm = comparison.perplexity(300, chunk=32)
    assert (full.mode, infllm.mode) == ("full", "infllm")
    assert infllm.perplexity == pytest.approx(full.perplexity, rel=1e-6)
    assert infllm.top1_agreement == full.top1_agreement == 1.0
    assert full.resident_bytes == full.full_bytes == comparison.full_bytes(300)


def test_few_blocks_hold_a_fraction_of_the_kv(loaded):
    comparison = Comparison(EngineConfig(**INFLLM, infllm_topk_blocks=2), loaded)
    full, infllm = comparison.passkey(400, 0.5)
    assert full.key == infllm.key and full.num_tokens == 400
    assert full.resident_fraction == 1.0
    # sinks 2 + local 4..6 + chunk 8 + 2 blocks x 2 pages = at most 20 of ~102 pages, plus
    # the summaries: a fp16 centroid per fp32 page (K and V) is 1/16 of the offloaded bytes.
    assert 0.1 < infllm.resident_fraction <= 20 / 100 + 1 / 16
    ppl_full, ppl_infllm = comparison.perplexity(300, chunk=32)
    assert ppl_infllm.resident_fraction < 0.3
    assert 0 < ppl_infllm.top1_agreement <= 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--infllm-topk-blocks", "0"],
            "argument --infllm-topk-blocks: must be a positive integer, got 0",
        ),
        (["--kv-dtype", "int8"], "infllm attention needs a float KV dtype"),
    ],
)
def test_bad_infllm_flags_are_one_line_errors(capsys, argv, message):
    assert main(["eval", "passkey", "--lengths", "500", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvscope: error: ") and message in err[0]


def test_bad_chunk_is_a_one_line_error(capsys):
    assert main(["eval", "perplexity", "--chunk", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "kvscope: error: argument --chunk: must be a positive integer, got 0 "
        "(see kvscope eval perplexity --help)"
    ]


@pytest.mark.slow
def test_eval_passkey_end_to_end_on_the_real_model(capsys):
    """SmolLM2 finds the key at 600 tokens with full attention, and with InfLLM holding
    sinks, a 128-token window and 4 of about 12 distant blocks."""
    code = main(
        ["eval", "passkey", "--lengths", "600", "--depths", "0.5", "--json",
         "--max-batched-tokens", "64", "--infllm-local-tokens", "128",
         "--infllm-block-pages", "2", "--infllm-topk-blocks", "4"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["mode"]: r for r in doc["rows"]}
    assert rows["full"]["correct"] and rows["infllm"]["correct"]
    assert rows["full"]["key"] in rows["full"]["answer"]
    assert rows["infllm"]["resident_fraction"] < rows["full"]["resident_fraction"] == 1.0
    assert doc["config"]["topk_blocks"] == 4


@pytest.mark.slow
def test_eval_too_long_is_a_one_line_error(capsys):
    assert main(["eval", "passkey", "--lengths", "9000", "--depths", "0.5"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = [line for line in lines if not line.startswith("[kvscope] ")]  # loading model ...
    assert len(err) == 1 and "exceed what one request may hold" in err[0]
