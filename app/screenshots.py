"""``make screenshots``: every picture in screenshots/ from the current UI and real runs.

Records two real runs of the built-in shared-prefix workload (prefix cache
off, then on, so the dashboard's Compare page has something to compare and the
page maps show pages shared by many requests), then takes the terminal UI's
pictures at the step with the most shared pages and the dashboard's
screenshots from that database and
redraws the allocation simulator's plot. Two more databases hold what the
chat runs cannot show: a real-model InfLLM run of the long-context workload
(the Long context page, the TUI's retrieval strip) and a watched synthetic
vLLM deployment of four data-parallel ranks (app.watch_demo: the Watched
deployment page and the TUI's watch view).

``--gpu-db PATH`` draws only the GPU pictures (``tui-gpu.png``, ``dash-gpu-*.png``)
from the newest run of a database recorded on a GPU, such as the one
``bench/gpu_engine.py`` writes: nothing here can record a GPU run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from kvscope.app.dashboard import screenshots as dash_shots
from kvscope.app.tui import screenshots as tui_shots
from kvscope.app.watch_demo import record_watch_demo
from kvscope.db.infllm import retrievals
from kvscope.db.page_replay import most_shared_step
from kvscope.db.runs import list_runs
from kvscope.engine.errors import KvscopeError

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


# One long shared document, questions arriving over a few seconds: later requests find
# it in the prefix tree and share its pages while earlier ones still decode.
SHARED_FLAGS = ("--workload", "shared-prefix", "--rate", "4")


def record(db: Path, *flags: str) -> None:
    cmd = [sys.executable, "-m", "kvscope.app.cli", "run", "--headless", "--requests", "16"]
    cmd += ["--db", str(db), *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


# A capacity sweep for the Capacity page: the Mooncake slice the tests use (in the repository,
# so the picture needs nothing from outside it), four policies over a decade and a half.
REPLAY_TRACE = (
    Path(__file__).resolve().parent.parent / "tests/data/mooncake_conversation_head400.jsonl"
)
REPLAY_FLAGS = ("--capacity", "3e4,1e5,3e5,1e6,3e6", "--eviction-policy", "lru,lfu,fifo,belady")


def record_replay(db: Path) -> None:
    cmd = [sys.executable, "-m", "kvscope.app.cli", "replay", str(REPLAY_TRACE), "--db", str(db)]
    subprocess.run([*cmd, *REPLAY_FLAGS], check=True, stdout=subprocess.DEVNULL)


# The pages a GPU run adds most to: its throughput, memory budget, kernels against the
# device's peaks, and the NVML samples.
GPU_PAGES = ("overview", "kv-cache", "kernels", "gpu")


def gpu_pictures(db: Path, out: Path) -> list[Path]:
    """The TUI and dashboard pictures of the newest run in ``db``, named ``*-gpu*``."""
    written = tui_shots.shoot(db, None, out, (("tui-gpu", (140, 42), ()),))
    return written + dash_shots.capture(db, out, pages=GPU_PAGES, prefix="dash-gpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvscope.app.screenshots")
    parser.add_argument("--gpu-db", type=Path, help="draw the GPU pictures from this database")
    args = parser.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    if args.gpu_db is not None:
        try:
            written = gpu_pictures(args.gpu_db, OUT)
        except KvscopeError as exc:
            print(f"screenshots: error: {exc}", file=sys.stderr)
            return 2
        print("\n".join(map(str, written)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "shots.db"
        record(db, *SHARED_FLAGS, "--no-prefix-cache")
        record(db, *SHARED_FLAGS)  # the newest run, shown by default
        infllm = Path(tmp) / "infllm.db"
        record(infllm, *INFLLM_FLAGS)
        watch = Path(tmp) / "watch.db"
        watch_run = record_watch_demo(watch)
        newest = list_runs(db)[0].run_id
        tui_shots.shoot(db, newest, OUT, step=most_shared_step(db, newest))
        # Halfway through the retrievals: requests still hold pages, and the
        # strip has the steps before it.
        steps = [r.step for r in retrievals(infllm, 1)]
        middle = (min(steps) + max(steps)) // 2
        tui_shots.shoot(infllm, 1, OUT, tui_shots.INFLLM_SHOTS, step=middle)
        tui_shots.shoot_watch(watch, watch_run, OUT)
        replay = Path(tmp) / "replay.db"
        record_replay(replay)
        dash_shots.capture(db, OUT, skip=("long-context", "watch", "capacity"))
        dash_shots.capture(replay, OUT, pages=("capacity",))
        dash_shots.capture(infllm, OUT, pages=("long-context",))
        dash_shots.capture(watch, OUT, pages=("watch",))
    subprocess.run(
        [sys.executable, "-m", "kvscope.app.cli", "simulate", "--plot", str(OUT / "simulate.png")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"screenshots written to {OUT}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
