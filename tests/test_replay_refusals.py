"""``kvscope replay``: requests that can never run are refused and said so; options that
would be ignored are refused before any work."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kvscope.engine.replay import ReplayConfig, ReplayDriver, read_replay_trace

from support.cli_runs import one_error, run_cli
from support.mooncake_slice import SLICE

GIANT = 10**8  # the most a trace line may ask (engine/replay/traces.py MAX_REQUEST_TOKENS)


def warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("kvscope replay: warning:")]


def giant_trace(tmp_path: Path) -> Path:
    """Four ordinary requests and, on line 3, one of 1e8 prompt and 1e8 output tokens
    (which a sequential replay had decoded for minutes, gigabytes in)."""
    rows = [{"prompt_len": 1000 + 100 * i, "max_tokens": 20} for i in range(4)]
    rows.insert(2, {"prompt_len": GIANT, "max_tokens": GIANT})
    path = tmp_path / "giant.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timing", ["sequential", "roofline"])
@pytest.mark.parametrize("capacity", ["1e5", None])  # None: the default sweep
def test_a_request_no_model_could_serve_is_refused_and_the_rest_run(
    capsys, tmp_path, timing, capacity
):
    path = giant_trace(tmp_path)
    argv = ["replay", str(path), "--timing", timing, "--eviction-policy", "lru", "--json"]
    argv += ["--workers", "1", "--quiet"] + (["--capacity", capacity] if capacity else [])
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    report = json.loads(out)
    assert report["max_model_len"] == 1 << 20  # no --preset: the default context
    for point in report["points"]:  # the unlimited ceiling included
        assert point["rejected"] == 1 and point["finished"] == 4
        assert point["refused"] == {
            "context": {"count": 1, "first": f"{path}:3", "tokens": 2 * GIANT}
        }
    [warning] = warnings(err)  # one line, even with --quiet
    assert "1 of 5 requests refused" in warning and f"{path}:3" in warning
    assert "context of 1,048,576 tokens" in warning
    # the answer's mean request is over the admitted ones, not 40 million tokens
    assert all(a.get("mean_request_tokens", 0) < 2000 for a in report["answers"])


def test_figures_are_over_the_admitted_requests(capsys, tmp_path):
    """A refused line changes nothing for the others: the same hits as without it."""
    lines = SLICE.read_text().splitlines()[:30]
    giant = json.loads(lines[5])
    giant["input_length"] = GIANT
    path, without = tmp_path / "with.jsonl", tmp_path / "without.jsonl"
    path.write_text("\n".join(lines[:5] + [json.dumps(giant)] + lines[5:]) + "\n")
    without.write_text("\n".join(lines) + "\n")
    args = ("--capacity", "1e5,1e6", "--eviction-policy", "lru", "--json", "--quiet")
    reports = []
    for p in (path, without):
        code, out, err = run_cli(capsys, "replay", str(p), *args, "--workers", "1")
        assert code == 0, err
        reports.append(json.loads(out))
    for a, b in zip(reports[0]["points"], reports[1]["points"], strict=True):
        assert (a["rejected"], b["rejected"]) == (1, 0)
        assert (a["hit_tokens"], a["queried_tokens"]) == (b["hit_tokens"], b["queried_tokens"])


def test_max_model_len_refuses_what_the_context_cannot_hold(capsys):
    """--max-model-len 8192 (llama3-8b's context, vLLM's default for it) refuses the
    longer requests; a named preset alone does not, so naming the default preset gives
    the same answer as not naming it."""
    trace = read_replay_trace(SLICE).head(40)
    longer = sum(e.input_len + max(1, e.output_len) > 8192 for e in trace.entries)
    assert 0 < longer < 40
    args = ("replay", str(SLICE), "--limit", "40", "--capacity", "1e6", "--eviction-policy")
    args += ("lru", "--json", "--quiet", "--workers", "1")
    code, out, err = run_cli(capsys, *args, "--max-model-len", "8192")
    assert code == 0, err
    report = json.loads(out)
    assert report["max_model_len"] == 8192
    assert all(p["refused"]["context"]["count"] == longer for p in report["points"])
    assert "(--max-model-len)" in warnings(err)[0]
    for extra in (("--preset", "llama3-8b"), ()):
        code, out, err = run_cli(capsys, *args, *extra)
        assert code == 0 and not warnings(err), err
        assert all(p["rejected"] == 0 for p in json.loads(out)["points"])


def test_a_request_larger_than_the_kv_pool_is_refused_and_counted_per_row(capsys, tmp_path):
    """Roofline timing: --capacity is the whole pool. At 1e4 tokens every request of
    12,000 tokens is refused: the row says so, where it had been a silent 0.0% and a
    blank TTFT."""
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": i, "input_length": 12000 - 10000 * (i == 3), "output_length": 10,
             "hash_ids": list(range(24 * i, 24 * i + 24))} for i in range(5)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["replay", str(path), "--timing", "roofline", "--capacity", "1e4,1e5"]
    argv += ["--eviction-policy", "lru", "--workers", "1", "--quiet"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    table = out.split("\n\n")[0].splitlines()
    assert table[0].split()[-1] == "refused"
    assert table[1].startswith("1e4") and table[1].endswith("4 of 5")
    assert table[2].startswith("1e5") and table[2].endswith("0 of 5")
    [warning] = warnings(err)
    assert "up to 4 of 5 requests refused" in warning
    assert f"larger than the whole KV pool at 1e4 tokens (page 512), first {path}:1" in warning
    code, out, err = run_cli(capsys, *argv, "--json")
    points = {p["capacity_tokens"]: p for p in json.loads(out)["points"]}
    assert points[10_000]["refused"]["capacity"]["count"] == 4
    assert points[10_000]["finished"] == 1 and points[100_000]["rejected"] == 0


def test_the_driver_sizes_its_pool_for_the_admitted_requests_only():
    """A refused giant must not make the unlimited point allocate its pages."""
    trace = read_replay_trace(SLICE).head(5)
    small = ReplayDriver(trace, ReplayConfig(capacity_tokens=None, max_model_len=1 << 20))
    trace.entries[2].input_len = GIANT
    driver = ReplayDriver(trace, ReplayConfig(capacity_tokens=None, max_model_len=1 << 20))
    assert driver.num_pages < small.num_pages  # only the four others' pages
    result = driver.run()
    assert (result.finished, result.rejected) == (4, 1)
    assert result.refused["context"]["first"].endswith(":3")


# --- options that do not apply ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--run", "2"), ("--run 2", "database", "JSONL trace")),
        (("--routing", "prefix-aware"), ("--routing prefix-aware", "--replicas")),
        (("--replicas", "1", "--routing", "round-robin"), ("--routing round-robin", "--replicas")),
        (("--speed", "2"), ("--speed 2", "--timing roofline")),
        (("--max-batched-tokens", "512"), ("--max-batched-tokens 512", "--timing roofline")),
        (("--max-num-seqs", "4"), ("--max-num-seqs 4", "--timing roofline", "sequential")),
        (
            ("--timing", "sequential", "--max-num-seqs", "4"),
            ("--max-num-seqs 4", "--timing roofline"),
        ),
        (("--capacity", "1e5,,1e6"), ("--capacity", "empty item", "'1e5,,1e6'")),
        (("--capacity", "1e5,"), ("--capacity", "empty item", "'1e5,'")),
        (("--capacity", "1.5"), ("--capacity 1.5", "not a whole number of tokens")),
        (("--capacity", "1e5,2.0005k"), ("--capacity 2.0005k", "not a whole number")),
        (("--eviction-policy", "lru,,fifo"), ("--eviction-policy", "empty item")),
        (("--page-size", "256,"), ("--page-size", "empty item")),
        (("--capacity", "1e9999999999"), ("is above 1e+15 tokens",)),  # a decimal overflow
    ],
)
def test_an_option_that_would_be_ignored_is_one_error_before_any_work(
    capsys, tmp_path, args, fragments
):
    # The trace is not even valid JSON: the option is refused before it is read.
    path = tmp_path / "t.jsonl"
    path.write_text("{not json\n")
    db = tmp_path / "r.db"
    code, _, err = run_cli(capsys, "replay", str(path), *args, "--db", str(db))
    assert code == 2
    one_error(err, *fragments)
    assert not db.exists()


def test_block_size_on_a_database_source_is_refused(capsys, tmp_path):
    db = tmp_path / "k.db"
    sqlite3.connect(db).execute("CREATE TABLE t (a)").connection.close()
    code, _, err = run_cli(capsys, "replay", str(db), "--block-size", "16")
    assert code == 2
    one_error(err, "--block-size 16", "database source", "page size")


@pytest.mark.parametrize(
    ("capacity", "tokens"), [("1.5e5", 150_000), ("2.5M", 2_500_000), ("0.1k", 100)]
)
def test_a_fractional_spelling_of_a_whole_token_count_is_fine(capsys, capacity, tokens):
    code, out, err = run_cli(
        capsys, "replay", str(SLICE), "--limit", "3", "--capacity", capacity,
        "--eviction-policy", "lru", "--json", "--quiet", "--workers", "1",
    )  # fmt: skip
    assert code == 0, err
    assert {p["capacity_tokens"] for p in json.loads(out)["points"]} == {tokens, None}


def test_options_that_apply_are_still_taken(capsys):
    """--speed and the batch limits with roofline, --routing with --replicas: the errors
    above stay narrow."""
    base = ("replay", str(SLICE), "--limit", "6", "--capacity", "1e6", "--eviction-policy")
    base += ("lru", "--quiet", "--workers", "1")
    code, _, err = run_cli(capsys, *base, "--timing", "roofline", "--speed", "2")
    assert code == 0, err
    limits = ("--max-batched-tokens", "512", "--max-num-seqs", "2")
    code, _, err = run_cli(capsys, *base, "--timing", "roofline", *limits)
    assert code == 0, err
    code, out, err = run_cli(
        capsys, *base, "--replicas", "2", "--routing", "least-loaded", "--json"
    )
    assert code == 0, err
    assert {r["routing"] for r in json.loads(out)["replicas"]} == {"least-loaded"}


def test_a_recorded_run_names_the_refused_request_by_its_id(capsys, tmp_path):
    """A database source has no lines: the warning names the run and the request."""
    db = tmp_path / "r.db"
    args = ("--capacity", "1e6", "--eviction-policy", "lru", "--quiet", "--workers", "1")
    code, _, err = run_cli(capsys, "replay", str(SLICE), "--limit", "8", *args, "--db", str(db))
    assert code == 0, err
    code, out, err = run_cli(capsys, "replay", str(db), "--run", "1", *args, "--json",
                             "--max-model-len", "7000")  # fmt: skip
    assert code == 0, err
    first = json.loads(out)["points"][0]["refused"]["context"]["first"]
    assert first.startswith("r.db#run1 request ") and first in warnings(err)[0]
