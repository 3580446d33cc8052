"""``kvscope run`` end to end: the main job records a real run; Ctrl-C marks it interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from db import queries

pytestmark = pytest.mark.slow


def test_headless_json_summary(tmp_path):
    db = tmp_path / "k.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
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
    [run] = queries.list_runs(db)
    assert run.status == "complete" and run.config["workload"] == "chat"
    assert queries.run_summary(db, run.run_id).output_tokens == summary["output_tokens"]


def test_ctrl_c_marks_run_interrupted(tmp_path):
    db = tmp_path / "k.db"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
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
