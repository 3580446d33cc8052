"""``make screenshots``: every picture in screenshots/ from the current UI and real runs.

Records two real runs of the built-in chat workload (prefix cache on, then
off, so the dashboard's Compare page has something to compare), then takes
the terminal UI's and the dashboard's screenshots from that database and
redraws the allocation simulator's plot. Two more databases hold what the
chat runs cannot show: a real-model InfLLM run of the long-context workload
(the Long context page, the TUI's retrieval strip) and a watched synthetic
vLLM deployment of four data-parallel ranks (app.watch_demo: the Watched
deployment page and the TUI's watch view).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from app.dashboard import screenshots as dash_shots
from app.tui import screenshots as tui_shots
from app.watch_demo import record_watch_demo
from db.infllm import retrievals

OUT = Path("screenshots")


# Long prompts (the long-context workload: about 700 to 1,400 tokens) with a small
# resident window, so most of each request's KV is distant and retrieved.
INFLLM_FLAGS = (
    "--workload",
    "long-context",
    "--requests",
    "3",
    "--attention-mode",
    "infllm",
    "--infllm-initial-tokens",
    "32",
    "--infllm-local-tokens",
    "128",
    "--infllm-topk-blocks",
    "4",
)


def record(db: Path, *flags: str) -> None:
    cmd = [sys.executable, "-m", "app.cli", "run", "--headless", "--requests", "16"]
    cmd += ["--db", str(db), *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "shots.db"
        record(db, "--no-prefix-cache")
        record(db)  # the newest run, shown by default
        infllm = Path(tmp) / "infllm.db"
        record(infllm, *INFLLM_FLAGS)
        watch = Path(tmp) / "watch.db"
        watch_run = record_watch_demo(watch)
        tui_shots.main(["--db", str(db), "--out", str(OUT)])
        # Halfway through the retrievals: requests still hold pages, and the
        # strip has the steps before it.
        steps = [r.step for r in retrievals(infllm, 1)]
        middle = (min(steps) + max(steps)) // 2
        tui_shots.shoot(infllm, 1, OUT, tui_shots.INFLLM_SHOTS, step=middle)
        tui_shots.shoot_watch(watch, watch_run, OUT)
        dash_shots.capture(db, OUT, skip=("long-context", "watch"))
        dash_shots.capture(infllm, OUT, pages=("long-context",))
        dash_shots.capture(watch, OUT, pages=("watch",))
    subprocess.run(
        [sys.executable, "-m", "app.cli", "simulate", "--plot", str(OUT / "simulate.png")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"screenshots written to {OUT}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
