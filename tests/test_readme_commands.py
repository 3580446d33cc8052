"""The README's tour names every subcommand the CLI has, so a new command cannot ship undocumented."""

from __future__ import annotations

from pathlib import Path

import app.cli

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_mentions_every_command() -> None:
    text = README.read_text()
    missing = [name for name in app.cli.COMMANDS if f"kvscope {name}" not in text]
    assert not missing, f"README does not mention: {missing}"
