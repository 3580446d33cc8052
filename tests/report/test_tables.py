"""CSV and JSON exports carry every row of the run's tables."""

from __future__ import annotations

import csv
import json

from kvscope.app.cli import main


def test_csv_directory_has_one_file_per_table(synthetic_db, tmp_path, capsys):
    path, run_id, run = synthetic_db
    out = tmp_path / "csv"
    assert main(["report", str(path), "--format", "csv", "-o", str(out)]) == 0
    files = {p.stem for p in out.iterdir()}
    assert (
        capsys.readouterr().out.strip()
        == f"{out}/: a directory of {len(files)} CSV files, one per table"
    )
    assert files == {
        "summary",
        "requests",
        "kernel_stats",
        "steps",
        "kernels",
        "gpu_samples",
        "events",
    }
    with (out / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == run.truth.steps
    assert [int(s["step"]) for s in steps] == list(range(run.truth.steps))
    with (out / "summary.csv").open() as f:
        (summary,) = csv.DictReader(f)
    assert int(summary["evicted_pages"]) == run.truth.evicted_pages
    with (out / "requests.csv").open() as f:
        assert len(list(csv.DictReader(f))) == run.truth.requests


def test_json_document_holds_every_table(synthetic_db, tmp_path):
    path, run_id, run = synthetic_db
    out = tmp_path / "run.json"
    assert (
        main(["report", str(path), "--run", str(run_id), "--format", "json", "-o", str(out)]) == 0
    )
    document = json.loads(out.read_text())
    assert document["run"]["run_id"] == run_id
    tables = document["tables"]
    assert tables["summary"][0]["preemptions"] == run.truth.preemptions
    assert sum(k["calls"] for k in tables["kernel_stats"]) == sum(run.truth.kernel_calls.values())
    events = tables["events"]
    evicted = [e for e in events if e["kind"] == "page_evicted"]
    assert len(evicted) == run.truth.evicted_pages
    assert {"page", "action", "policy"} <= evicted[0]["payload"].keys()
    assert [e["t_s"] for e in events] == sorted(e["t_s"] for e in events)
    assert len(tables["gpu_samples"]) == run.truth.steps


def test_default_output_name(synthetic_db, tmp_path, monkeypatch):
    path, run_id, _ = synthetic_db
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(path), "--format", "csv"]) == 0
    assert (tmp_path / f"kvscope-run{run_id}-csv").is_dir()


def test_a_write_that_fails_after_opening_names_the_path(synthetic_db, capsys):
    """A full disk had been only "No space left on device": which file, it did not say."""
    path, _, _ = synthetic_db
    for fmt in ("html", "trace"):
        assert main(["report", str(path), "--format", fmt, "-o", "/dev/full"]) == 2
        err = capsys.readouterr().err
        assert err == "kvscope: error: cannot write /dev/full: No space left on device\n"
