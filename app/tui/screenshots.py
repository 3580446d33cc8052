"""Regenerate the TUI's screenshots (``make screenshots``): PNGs in screenshots/.

By default a fresh run of the real model is recorded first (``kvscope run
--headless``, about 20 s), so the pictures show what a user sees; ``--db``
uses an existing recording instead. Each picture is Textual's SVG screenshot
turned into PNG by ``rsvg-convert`` (Debian package librsvg2-bin).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kvscope.app.tui.app import KvscopeApp
from kvscope.app.tui.data import check_database
from kvscope.app.tui.watch_view import WatchView
from kvscope.db import queries, series
from kvscope.engine.errors import KvscopeError

# (file name, terminal size, keys pressed before the picture)
SHOTS = (
    ("tui-main", (140, 42), ()),
    ("tui-help", (140, 42), ("question_mark",)),
    ("tui-80x24", (80, 24), ()),
)
# An InfLLM run: tall enough for the retrieval strip under the panels.
INFLLM_SHOTS = (("tui-infllm", (140, 56), ()),)
WATCH_SHOT = ("tui-watch", (140, 48))


def busiest_step(path: Path, run_id: int) -> int:
    """The step to take the pictures at (see db.series.busiest_step)."""
    step = series.busiest_step(path, run_id)
    if step is None:
        raise KvscopeError(f"run {run_id} in {path} has no steps to show")
    return step


async def _shoot(
    path: Path, run_id: int, step: int, size: tuple[int, int], keys: tuple[str, ...], svg: Path
) -> None:
    app = KvscopeApp(path, run_id=run_id, follow=False)
    async with app.run_test(size=size) as pilot:
        while app.view is None:
            await pilot.pause(0.05)
        app.show_step(step)
        while app.view.row is None or app.view.row.step != step or app._loading:
            await pilot.pause(0.05)
        await pilot.press(*keys)
        await pilot.pause(0.3)
        app.save_screenshot(svg.name, str(svg.parent))


async def _shoot_watch(path: Path, run_id: int, size: tuple[int, int], svg: Path) -> None:
    app = KvscopeApp(path, run_id=run_id, follow=False)
    async with app.run_test(size=size) as pilot:
        while not app.query(WatchView) or app.query_one(WatchView).snapshot is None:
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        app.save_screenshot(svg.name, str(svg.parent))


def _png(svg: Path, png: Path) -> Path:
    subprocess.run(["rsvg-convert", "--zoom", "1.5", str(svg), "-o", str(png)], check=True)
    return png


def shoot_watch(path: Path, run_id: int, out: Path) -> Path:
    """The picture of a watch run (kind ``watch``: no steps to pick, the newest state)."""
    name, size = WATCH_SHOT
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        svg = Path(tmp) / f"{name}.svg"
        asyncio.run(_shoot_watch(path, run_id, size, svg))
        return _png(svg, out / f"{name}.png")


def shoot(
    path: Path, run_id: int | None, out: Path, shots: tuple = SHOTS, step: int | None = None
) -> list[Path]:
    """Write every picture of ``shots`` for ``run_id`` (default: the newest) into ``out``,
    at ``step`` (default: the busiest step)."""
    if shutil.which("rsvg-convert") is None:
        raise KvscopeError("rsvg-convert not found: apt-get install librsvg2-bin")
    check_database(path, run_id)
    run_id = run_id if run_id is not None else queries.list_runs(path)[0].run_id
    step = busiest_step(path, run_id) if step is None else step
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, size, keys in shots:
            svg = Path(tmp) / f"{name}.svg"
            asyncio.run(_shoot(path, run_id, step, size, keys, svg))
            written.append(_png(svg, out / f"{name}.png"))
    return written


def record_real_run(path: Path) -> None:
    """Record the pictures' run: the real model on the built-in chat workload."""
    command = [sys.executable, "-m", "kvscope.app.cli", "run", "--headless", "--requests", "16"]
    done = subprocess.run([*command, "--db", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no message"]
        raise KvscopeError(f"recording the run failed: {last[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvscope.app.tui.screenshots", description=__doc__
    )
    parser.add_argument(
        "--db", type=Path, help="an existing recording (default: record a fresh real run)"
    )
    parser.add_argument(
        "--run", type=int, metavar="ID", help="the run to show (default: the newest)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("screenshots"),
        help="where the PNGs go (default screenshots/)",
    )
    args = parser.parse_args(argv)
    try:
        if args.db is not None:
            written = shoot(args.db, args.run, args.out)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                db = Path(tmp) / "screenshots.db"
                record_real_run(db)
                written = shoot(db, None, args.out)
    except KvscopeError as exc:
        print(f"screenshots: error: {exc}", file=sys.stderr)
        return 2
    for png in written:
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
