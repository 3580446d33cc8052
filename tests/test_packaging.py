"""kvscope installs as one import name and runs as users run it.

The project's folders (app/, db/, engine/, kernels/, profiler/) install as
``kvscope.app`` and so on. When they installed under their own generic names,
transformers' dependency on Hugging Face's top-level ``kernels`` package broke
``kvscope run`` on a fresh install while the suite, run from the repository
root, passed. So here the installed command runs from an empty directory with
a foreign package of each of those names first on ``PYTHONPATH``, and a wheel
built from the tree is opened to check what it would install.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from support.installed import KVSCOPE

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("app", "db", "engine", "kernels", "profiler")


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> dict[str, str]:
    """The environment with a foreign package of each generic name first on the path."""
    path = tmp_path_factory.mktemp("foreign")
    for name in FOLDERS:
        (path / name).mkdir()
        (path / name / "__init__.py").write_text(f'"""Someone else\'s {name}."""\nFOREIGN = True\n')
    env = {k: v for k, v in os.environ.items() if k not in ("KVSCOPE_DB", "PYTHONPATH")}
    return env | {"PYTHONPATH": str(path)}


def kvscope(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [KVSCOPE, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"kvscope {' '.join(argv)}: {proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr
    return proc


def test_the_foreign_packages_do_shadow_those_names(tmp_path, foreign):
    # Guards the test itself: an import of a bare name gets the foreign package.
    probe = "import app, db, engine, kernels, profiler; print(kernels.FOREIGN)"
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=foreign, capture_output=True, text=True
    )
    assert proc.stdout.strip() == "True", proc.stderr


def test_version_from_another_directory(tmp_path, foreign):
    out = kvscope(tmp_path, foreign, "--version").stdout
    assert re.fullmatch(r"kvscope \d+\.\d+\.\d+\S*\n", out), out


@pytest.mark.slow
def test_generate_runs_the_real_model(tmp_path, foreign):
    out = kvscope(tmp_path, foreign, "generate", "The capital of France is", "--max-tokens", "4",
                  "--json").stdout  # fmt: skip
    [row] = [json.loads(line) for line in out.splitlines()]
    assert len(row["token_ids"]) == 4 and row["text"].strip().startswith("Paris")


@pytest.mark.slow
def test_headless_run_then_report(tmp_path, foreign):
    """The main job, headless (no terminal here), recorded, then read back by ``report``."""
    kvscope(
        tmp_path, foreign, "run", "--headless", "--requests", "3", "--rate", "0", "--db", "k.db"
    )
    report = json.loads(kvscope(tmp_path, foreign, "report", "k.db", "--format", "json").stdout)
    run = report["run"]
    assert (run["status"], run["requests"], run["kind"]) == ("complete", 3, "engine"), run
    assert run["steps"] > 3 and run["events_written"] > 0
    assert sorted(os.listdir(tmp_path)) == ["k.db"]  # nothing written beside it


def package_names() -> dict[str, str]:
    """Each import name the folders hold (a folder with ``__init__.py``) -> its folder."""
    names = {}
    for top in FOLDERS:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            folder = init.parent.relative_to(ROOT)
            names["kvscope." + ".".join(folder.parts)] = str(folder)
    return names


def test_pyproject_lists_every_package_folder():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(setuptools["packages"]) == sorted(package_names())
    assert setuptools["package-dir"] == {f"kvscope.{top}": top for top in FOLDERS}


@pytest.mark.slow
def test_a_wheel_installs_one_top_level_name(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [wheel] = tmp_path.glob("kvscope-*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in files if ".dist-info/" not in name}
    assert tops == {"kvscope"}
    sources = {
        "kvscope/" + str(path.relative_to(ROOT))
        for top in FOLDERS
        for path in (ROOT / top).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert sources <= set(files), sorted(sources - set(files))[:10]
    assert "kvscope/app/tui/tui.tcss" in files  # package data
    entry = zipfile.ZipFile(wheel).read(next(f for f in files if f.endswith("entry_points.txt")))
    assert "kvscope = kvscope.app.cli:main" in entry.decode()


def test_the_suite_does_not_import_from_the_repository_root():
    """Collection imports every test module: one that put the root on ``sys.path`` (a bench
    script did) made transformers' ``import kernels`` find kvscope's folder for the rest of
    the session. Only tests/ (for tests/support) may be on the path."""
    roots = [p for p in sys.path if p and Path(p).resolve() == ROOT]
    assert not roots, sys.path
    spec = importlib.util.find_spec("kernels")  # Hugging Face's, where transformers is installed
    assert spec is None or Path(spec.origin or "").resolve() != ROOT / "kernels" / "__init__.py"
