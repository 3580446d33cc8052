"""Running the CLI in-process and checking its one-line errors."""

from __future__ import annotations

from kvscope.app.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str, *fragments: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvscope: error: "), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], lines[0]
