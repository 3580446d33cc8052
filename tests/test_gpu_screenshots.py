"""``make screenshots GPU_DB=...`` draws the GPU pictures from a database recorded on a GPU.

No GPU here: the database is a synthetic run with NVML samples, recorded through the
real Recorder, which is what a GPU run's database holds for these pages.
"""

from __future__ import annotations

import shutil
import struct

import pytest

from kvscope.app.dashboard.screenshots import CHROMIUM
from kvscope.app.screenshots import gpu_pictures, main
from kvscope.profiler.synthetic import record_synthetic

pytestmark = pytest.mark.browser


def _png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def test_gpu_pictures_from_a_recorded_gpu_run(tmp_path):
    if not CHROMIUM.exists() or shutil.which("rsvg-convert") is None:
        pytest.skip("needs Debian's chromium and rsvg-convert (make browser)")
    db = tmp_path / "gpu.db"
    record_synthetic(db, num_requests=12, num_pages=64, gpu=True, seed=5)
    written = gpu_pictures(db, tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == sorted(
        ["tui-gpu.png"] + [f"dash-gpu-{k}.png" for k in ("overview", "kv-cache", "kernels", "gpu")]
    )
    for path in written:
        width, height = _png_size(path)
        assert width >= 800 and height >= 400, path.name


def test_a_missing_gpu_database_is_one_error_line(tmp_path, capsys):
    assert main(["--gpu-db", str(tmp_path / "absent.db")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("screenshots: error: ") and err.count("\n") == 1
