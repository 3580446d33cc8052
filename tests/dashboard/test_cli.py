"""``kvscope dash``: what a user sees when something is wrong, in one line."""

from __future__ import annotations

import socket

from kvscope.app.cli import main


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_missing_database(tmp_path, capsys):
    assert main(["dash", str(tmp_path / "missing.db")]) == 2
    assert _error_line(capsys) == f"kvscope: error: no database at {tmp_path / 'missing.db'}"


def test_default_database_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "env.db"))
    assert main(["dash"]) == 2
    assert "no database at" in _error_line(capsys)


def test_port_in_use(synthetic_db, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dash", str(synthetic_db[0]), "--port", str(port)]) == 2
    assert _error_line(capsys) == (
        f"kvscope: error: port {port} on 127.0.0.1 is in use; choose another with --port"
    )


def test_binds_loopback_by_default():
    from kvscope.app.cli import build_parser

    args = build_parser().parse_args(["dash"])
    assert (args.host, args.port) == ("127.0.0.1", 8050)
