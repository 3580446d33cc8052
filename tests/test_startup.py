"""Commands that need no model start at once: they never import torch.

Every command's module is imported to build the parser, so one heavy import at
the top of any of them (torch is about 2 s here) had made ``kvscope --version``
take 2.6 s. Each case runs the CLI in a fresh interpreter (this one has long
imported everything) and checks which heavy packages it imported; no timings,
which CI is too noisy for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvscope.app.cli import COMMANDS

# Model and tensor math, and the two front ends.
HEAVY = ("torch", "triton", "transformers", "textual", "dash", "plotly")
# The database layer (about 0.2 s): for the commands that open no database.
DATABASE = ("sqlite_utils", "numpy")

# Runs the CLI, then prints (last line of stdout) the top-level packages imported.
PROBE = """\
import json, sys
from kvscope.app.cli import main
code = main(sys.argv[1:])
print()
print(json.dumps([code, sorted({name.split(".")[0] for name in sys.modules})]))
"""


def imported(tmp_path, *argv: str) -> tuple[int, set[str], str]:
    """(exit status, top-level packages imported, stdout and stderr) of ``kvscope argv``,
    run from an empty directory (no ./kvscope.db) in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "KVSCOPE_DB"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip(), proc.stderr
    code, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    return code, set(modules), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    from kvscope.profiler.synthetic import record_synthetic

    path = tmp_path_factory.mktemp("startup") / "runs.db"
    record_synthetic(path, num_requests=8, num_pages=16, seed=1)
    return str(path)


NO_DATABASE = [
    ["--version"],
    [],  # bare: the command list
    ["--help"],
    *([name, "--help"] for name in COMMANDS),
    ["calc", "--preset", "llama3-8b", "--seq-len", "4096", "--batch", "8"],
    ["calc", "--preset", "llama3-8b", "--device", "h100-80", "--json"],
    ["calc", "cliff", "--preset", "llama3-8b", "--device", "h100-80"],
]


@pytest.mark.parametrize("argv", NO_DATABASE, ids=" ".join)
def test_no_heavy_import_without_a_database(tmp_path, argv):
    code, modules, output = imported(tmp_path, *argv)
    assert code == 0, output
    assert sorted(modules & {*HEAVY, *DATABASE}) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "DB"],
        ["runs", "DB", "--json"],
        ["report", "DB", "--format", "json"],
        ["report", "DB", "--format", "csv", "-o", "tables"],
        ["report", "DB", "--format", "trace", "-o", "run.trace.json"],
    ],
    ids=" ".join,
)
def test_reading_a_database_imports_no_model(tmp_path, db, argv):
    code, modules, output = imported(tmp_path, *(db if arg == "DB" else arg for arg in argv))
    assert code == 0, output
    assert sorted(modules & set(HEAVY)) == []


def test_tui_checks_the_database_before_importing_textual(tmp_path, db):
    # Without a terminal the TUI refuses, after its database checks: the path up to the UI.
    code, modules, output = imported(tmp_path, "tui", db)
    assert code == 2 and "needs a terminal" in output, output
    assert sorted(modules & set(HEAVY)) == []
