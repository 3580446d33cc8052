"""Read-only use of a read-only database: runs and report work on a file in a directory the
user may not write (run as an unprivileged user: root ignores permissions)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from support.installed import KVSCOPE

# An unprivileged user who may read (and search) every file, as the checkout's Python
# under /root needs, but writes nothing it does not own: a read-only database, for real.
NOBODY = [
    *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
    *("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"),
]


@pytest.fixture()
def read_only_copy(synthetic_db, tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to read as an unprivileged user")
    path, run_id, _ = synthetic_db
    folder = tmp_path / "ro"
    folder.mkdir()
    copy = folder / "runs.db"
    shutil.copy(path, copy)
    copy.chmod(0o444)
    folder.chmod(0o555)
    tmp_path.chmod(0o755)
    return copy, run_id


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NOBODY, KVSCOPE, *argv],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )


def test_runs_and_report_read_a_read_only_database(read_only_copy, tmp_path):
    path, run_id = read_only_copy
    probe = as_nobody("runs", str(path), "--json")
    if "Permission denied" in probe.stderr and "python" in probe.stderr.lower():
        pytest.skip("the unprivileged user cannot run this checkout's Python")
    assert probe.returncode == 0, probe.stderr
    assert [r["run_id"] for r in json.loads(probe.stdout)] == [run_id]
    report = as_nobody("report", str(path), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["run"]["run_id"] == run_id
    assert not (path.parent / "runs.db-wal").exists()
