"""The README's tour: it names every subcommand, and its cheap lines do what the README says
beside them (run in-process in a scratch directory; the swap line loads the real model: slow)."""

from __future__ import annotations

import json
import re
import shlex
import socket
import sqlite3
from pathlib import Path

import pytest

import kvscope.app.cli as cli
from kvscope.app.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_mentions_every_command() -> None:
    text = README.read_text()
    missing = [name for name in cli.COMMANDS if f"kvscope {name}" not in text]
    assert not missing, f"README does not mention: {missing}"


def tour_lines() -> list[tuple[list[str], str]]:
    """(argv after ``kvscope``, the comment beside it) for each command of the tour."""
    text = README.read_text()
    block = text[text.index("## A tour") :]
    block = block[block.index("```bash") + 7 : block.index("```", block.index("```bash") + 7)]
    lines, current = [], ""
    for raw in block.splitlines():
        code, _, comment = raw.partition(" #")
        if not code.strip():  # a comment line continues the previous command's note
            if lines and comment:
                lines[-1] = (lines[-1][0], lines[-1][1] + " " + comment.strip())
            continue
        current += code.rstrip().rstrip("\\") + " "
        if raw.rstrip().endswith("\\"):
            continue
        lines.append((shlex.split(current)[1:], comment.strip()))
        current = ""
    return lines


def find(prefix: list[str]) -> tuple[list[str], str]:
    for argv, note in tour_lines():
        if argv[: len(prefix)] == prefix:
            return argv, note
    raise AssertionError(f"no tour line starts with kvscope {' '.join(prefix)}")


def test_the_tour_lines_parse() -> None:
    parser = cli.build_parser()
    lines = tour_lines()
    assert len(lines) >= 15, lines  # the block was found and split (an empty one parses vacuously)
    for argv, _ in lines:
        parser.parse_args(argv)  # raises UsageError for a flag the CLI does not have


def test_cheap_tour_lines_do_what_the_readme_says(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVSCOPE_DB", raising=False)
    argv, note = find(["calc", "--layers", "80"])
    assert main(argv) == 0
    out = capsys.readouterr().out
    total = next(row for row in out.splitlines() if row.startswith("KV for 16 x 4,096 tokens"))
    assert "160 GiB" in note and total.split()[-2:] == ["160", "GiB"]
    gqa = next(row for row in out.splitlines() if row.startswith("GQA"))
    assert "GQA row: 8 KV heads" in note and gqa.split()[1] == "8"
    for prefix in (["calc", "--preset"], ["calc", "offload"]):
        assert main(find(prefix)[0]) == 0
    assert main(find(["calc", "cliff"])[0]) == 0
    assert (tmp_path / "cliff.html").stat().st_size > 0
    assert main(find(["simulate"])[0]) == 0
    assert (tmp_path / "sim.html").stat().st_size > 0
    capsys.readouterr()
    assert main(find(["runs"])[0]) == 0
    assert "simulation" in capsys.readouterr().out  # the runs simulate --db recorded
    argv, note = find(["report"])
    assert main(argv) == 0 and (tmp_path / "run.html").stat().st_size > 0
    assert "json (stdout)" in note
    capsys.readouterr()
    assert main(["report", "kvscope.db", "--format", "json"]) == 0
    assert "tables" in json.loads(capsys.readouterr().out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_swap_tour_line_really_swaps(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv, note = find(["run", "--kv-dtype", "int8"])
    argv = [str(_free_port()) if a == "9100" else a for a in argv]
    assert main([*argv, "--json", "--db", "swap.db"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    claimed = int(re.search(r"(\d+) preempted", note).group(1))
    assert summary["preemptions"] == claimed
    with sqlite3.connect(tmp_path / "swap.db") as conn:
        modes = {
            json.loads(p)["mode"]
            for (p,) in conn.execute("SELECT payload FROM events WHERE kind='request_preempted'")
        }
        # --ignore-eos: every request ran to its max tokens, so the count above does not
        # hang on where a CPU's kernels let the text stop (8 on one machine, 10 on another)
        reasons = {r for (r,) in conn.execute("SELECT DISTINCT finish_reason FROM requests")}
    assert modes == {"swap"} and reasons == {"length"}
