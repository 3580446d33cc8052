"""``kvscope runs``: a table or JSON of a database's runs; bad paths are one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from profiler.synthetic import record_synthetic


def test_runs_lists_newest_first_as_table_and_json(tmp_path: Path, capsys) -> None:
    path = tmp_path / "k.db"
    first, _ = record_synthetic(path, num_requests=4, seed=1)
    second, _ = record_synthetic(path, {"page_size": 32}, "interrupted", num_requests=6)
    assert main(["runs", "--db", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "RUN", "KIND", "MODEL", "STATUS", "STARTED", "DURATION", "REQUESTS", "STEPS", "EVENTS", "DROPPED",
    ]  # fmt: skip
    assert lines[1].split()[:4] == [str(second), "synthetic", "synthetic", "interrupted"]
    assert lines[2].split()[:4] == [str(first), "synthetic", "synthetic", "complete"]
    assert lines[1].split()[8] == "6"  # requests

    assert main(["runs", "--db", str(path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in runs] == [second, first]
    assert runs[0]["config"] == {"page_size": 32} and runs[0]["requests"] == 6


def test_runs_uses_kvscope_db_by_default(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "env.db"))
    record_synthetic(tmp_path / "env.db", num_requests=2)
    assert main(["runs", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_empty_database(tmp_path: Path, capsys) -> None:
    from db.store import open_db

    open_db(tmp_path / "empty.db").conn.close()
    assert main(["runs", "--db", str(tmp_path / "empty.db")]) == 0
    assert capsys.readouterr().out.startswith("no runs in")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.db", None, "no database at"),
        ("text.db", "just text, not SQLite at all" * 10, "file is not a database"),
    ],
)
def test_bad_db_is_one_error_line(tmp_path: Path, capsys, name, content, message) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["runs", "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: error: ") and message in err
    assert err.count("\n") == 1
