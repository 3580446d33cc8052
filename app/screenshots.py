"""``make screenshots``: every picture in screenshots/ from the current UI and real runs.

Records two real runs of the built-in chat workload (prefix cache on, then
off, so the dashboard's Compare page has something to compare), then takes
the terminal UI's and the dashboard's screenshots from that database and
redraws the allocation simulator's plot.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from app.dashboard import screenshots as dash_shots
from app.tui import screenshots as tui_shots

OUT = Path("screenshots")


def record(db: Path, *flags: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "app.cli",
        "run",
        "--headless",
        "--requests",
        "16",
        "--db",
        str(db),
        *flags,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "shots.db"
        record(db, "--no-prefix-cache")
        record(db)  # the newest run, shown by default
        tui_shots.main(["--db", str(db), "--out", str(OUT)])
        dash_shots.main(["--db", str(db), "--out", str(OUT)])
    subprocess.run(
        [sys.executable, "-m", "app.cli", "simulate", "--plot", str(OUT / "simulate.png")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"screenshots written to {OUT}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
