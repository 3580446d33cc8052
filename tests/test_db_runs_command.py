"""``kvscope runs``: a table or JSON of a database's runs; bad paths are one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.app.cli import main
from kvscope.profiler.synthetic import record_synthetic


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
    from kvscope.db.store import open_db

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


def test_runs_takes_the_database_positionally_or_with_db(tmp_path: Path, capsys) -> None:
    path = tmp_path / "other.db"
    record_synthetic(path, num_requests=3)
    assert main(["runs", str(path), "--json"]) == 0
    positional = json.loads(capsys.readouterr().out)
    assert main(["runs", "--db", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == positional and len(positional) == 1
    assert main(["runs", str(path), "--db", str(path)]) == 0  # the same file twice is fine
    capsys.readouterr()
    assert main(["runs", str(path), "--db", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: error: two databases named") and err.count("\n") == 1


@pytest.mark.parametrize("command", ["runs", "tui", "dash", "report"])
def test_every_database_command_takes_db_positionally_or_as_an_option(
    command: str, monkeypatch, tmp_path: Path
) -> None:
    from kvscope.app.cli import build_parser
    from kvscope.app.db_argument import db_path

    parser = build_parser()
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "env.db"))
    assert db_path(parser.parse_args([command, "a.db"])) == Path("a.db")
    assert db_path(parser.parse_args([command, "--db", "b.db"])) == Path("b.db")
    assert db_path(parser.parse_args([command])) == tmp_path / "env.db"
    monkeypatch.delenv("KVSCOPE_DB")
    assert db_path(parser.parse_args([command])) == Path("kvscope.db")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--db", "r.db"], "r.db"),
        (["run"], "kvscope.db"),
        (["simulate", "--db", "s.db"], "s.db"),
        (["simulate", "--db"], "kvscope.db"),
    ],
)
def test_workload_commands_take_db_as_an_option_with_the_same_default(
    argv: list[str], expected: str, monkeypatch
) -> None:
    from kvscope.app.cli import build_parser
    from kvscope.app.db_argument import db_path

    monkeypatch.delenv("KVSCOPE_DB", raising=False)
    args = build_parser().parse_args(argv)
    assert db_path(args) == Path(expected)


def test_simulate_records_only_when_asked(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVSCOPE_DB", raising=False)
    assert main(["simulate", "--requests", "10", "--json"]) == 0
    assert not (tmp_path / "kvscope.db").exists()
    assert main(["simulate", "--requests", "10", "--db"]) == 0
    assert "recorded runs 1, 2, 3 in kvscope.db" in capsys.readouterr().out
    assert main(["runs", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_a_run_whose_config_is_not_json_is_one_error_line(tmp_path: Path, capsys) -> None:
    """A damaged config, hardware or versions column had been a JSONDecodeError
    traceback in runs, report and replay; it names the run and the column."""
    import sqlite3

    from kvscope.db.store import open_db
    from kvscope.db.writer import create_run

    path = tmp_path / "k.db"
    db = open_db(path)
    run_id = create_run(db, kind="replay", model=None, config={}, hardware={}, versions={},
                        started_at=1.0, start_ns=0)  # fmt: skip
    db.conn.close()
    for column in ("config", "hardware", "versions"):
        with sqlite3.connect(path) as conn:
            conn.execute(f"UPDATE runs SET {column} = '{{not json' WHERE id = ?", (run_id,))
        assert main(["runs", "--db", str(path)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"kvscope: error: run {run_id}'s {column} is not a JSON object: the database "
            "is damaged\n"
        )
        with sqlite3.connect(path) as conn:
            conn.execute(f"UPDATE runs SET {column} = '{{}}' WHERE id = ?", (run_id,))
    assert main(["runs", "--db", str(path)]) == 0


@pytest.mark.parametrize("command", ["runs", "report", "tui", "dash"])
def test_reading_commands_leave_an_empty_file_empty(
    tmp_path: Path, capsys, monkeypatch, command
) -> None:
    """``runs``, ``report`` and ``dash`` had written a kvscope schema into a 0-byte file
    (a typo, a ``touch``) and then called it a database without runs."""
    if command == "dash":  # a dashboard that did start returns at once, and the test fails
        from kvscope.app.dashboard.server import Server

        monkeypatch.setattr(Server, "serve_forever", lambda self: None)
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: error: ") and err.count("\n") == 1, err
    assert f"{path} is empty" in err
    assert path.stat().st_size == 0 and sorted(tmp_path.iterdir()) == [path]


def test_simulate_starts_a_database_in_an_empty_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "new.db"
    path.write_bytes(b"")
    assert main(["simulate", "--requests", "5", "--db", str(path)]) == 0
    capsys.readouterr()
    assert main(["runs", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3  # one run per allocator
