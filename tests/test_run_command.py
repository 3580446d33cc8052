"""``kvscope run`` end to end: the main job records a real run; Ctrl-C marks it interrupted."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time

import pytest

from kvscope.db import queries

from support.installed import KVSCOPE

pytestmark = pytest.mark.slow


def test_headless_json_summary(tmp_path):
    db = tmp_path / "k.db"
    proc = subprocess.run(
        [
            KVSCOPE,
            "run",
            "--headless",
            "--json",
            "--requests",
            "6",
            "--rate",
            "0",
            "--db",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in (
        "run_id",
        "db",
        "requests",
        "output_tokens",
        "tokens_per_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "prefix_hit_rate",
        "prefix_hit_tokens",
        "evicted_pages",
        "offloaded_pages",
        "preemptions",
        "peak_page_usage",
        "mean_token_usage",
        "dropped_events",
    ):
        assert key in summary
    assert summary["requests"] == 6 and summary["status"] == "complete"
    assert summary["prefix_hit_tokens"] > 0  # the chat workload shares a system prompt
    misses = summary["miss_reasons"]  # every admission computes its last token; rest is cold
    assert misses["last_token"] >= 6 and misses["cold"] > 0
    [run] = queries.list_runs(db)
    assert run.status == "complete" and run.config["workload"] == "chat"
    assert queries.run_summary(db, run.run_id).output_tokens == summary["output_tokens"]


def test_ctrl_c_marks_run_interrupted(tmp_path):
    db = tmp_path / "k.db"
    proc = subprocess.Popen(
        [
            KVSCOPE,
            "run",
            "--headless",
            "--requests",
            "40",
            "--rate",
            "0",
            "--db",
            str(db),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:  # wait until steps are being recorded
        if db.exists() and queries.list_runs(db) and (queries.latest_step(db, 1).step or 0) > 3:
            break
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    [run] = queries.list_runs(db)
    assert run.status == "interrupted"
    assert "interrupted" in out


def _run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [KVSCOPE, "run", "--headless", *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_builtin_workload_gets_a_budget_that_fits_its_longest_request(tmp_path):
    # shared-prefix prompts are longer than the 24 MiB default (34 pages of 16 tokens).
    db = tmp_path / "k.db"
    argv = ["--json", "--workload", "shared-prefix", "--requests", "6", "--rate", "0"]
    proc = _run_cli(*argv, "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    assert "KV budget 24 MiB -> " in proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["requests_rejected"] == 0
    assert summary["requests_finished"] == summary["requests"] == 6
    assert summary["prefix_hit_tokens"] > 0
    [run] = queries.list_runs(db)
    assert run.config["kv_budget_sized_to_workload"] is True
    assert run.config["kv_budget_source"] == "grown"  # the heading names it, not --kv-budget
    assert run.config["kv_budget_bytes"] > 24 << 20
    # two of the longest requests fit at once, in whole pages
    with sqlite3.connect(db) as conn:
        (longest,) = conn.execute("SELECT MAX(prompt_tokens + max_tokens) FROM requests").fetchone()
    assert longest > 34 * 16
    assert run.config["pages"] * 16 >= 2 * longest


def _jsonl(path, *word_counts: int):
    lines = [
        json.dumps({"prompt": "word " * n, "max_tokens": 4, "chat": False}) for n in word_counts
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_rejections_are_counted_and_their_reasons_printed_once_each(tmp_path):
    workload = _jsonl(tmp_path / "w.jsonl", 3, 100, 120)
    # an explicit budget is kept: 3 MiB is 4 pages of 16 fp32 tokens
    proc = _run_cli("--workload", workload, "--kv-budget", "3MiB", "--db", str(tmp_path / "k.db"))
    assert proc.returncode == 0, proc.stderr
    reasons = [line for line in proc.stderr.splitlines() if "rejected:" in line]
    assert len(reasons) == 1, proc.stderr
    assert re.fullmatch(
        r"\[kvscope\] 2 rejected: prompt of \d+-\d+ tokens needs more than the whole KV budget "
        r"\(4 pages x 16 tokens\)",
        reasons[0],
    )
    assert re.search(r"^requests rejected +2$", proc.stdout, re.MULTILINE)
    assert re.search(r"^requests finished +1 / 1$", proc.stdout, re.MULTILINE)


def test_a_run_whose_every_request_is_rejected_fails(tmp_path):
    db = tmp_path / "k.db"
    workload = _jsonl(tmp_path / "w.jsonl", 100, 110)
    proc = _run_cli("--json", "--workload", workload, "--kv-budget", "3MiB", "--db", str(db))
    assert proc.returncode == 2
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "failed"
    assert summary["requests_rejected"] == 2 and summary["requests_finished"] == 0
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("kvscope: error: every request was rejected (2, reasons above)")
    )
    assert "Traceback" not in proc.stderr
    [run] = queries.list_runs(db)
    assert run.status == "failed"
