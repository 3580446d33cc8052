"""Shared set-up for the benchmark scripts: thread policy, model, tables.

The scripts import the installed ``kvscope`` (``make install``), never the checkout's
folders: run them with ``.venv/bin/python bench/<name>.py`` from anywhere.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


LAYERS = ("app", "db", "engine", "kernels", "profiler")


def code_env(tree: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which a subprocess runs ``tree``'s code (a baseline commit's
    ``git worktree``) instead of the installed kvscope.

    A folder of links, ``kvscope/app`` to ``tree/app`` and so on, goes first on
    PYTHONPATH: sys.path is searched before the editable install's finder, so
    ``kvscope.engine`` is the tree's. A tree from before the one import name (its
    modules imported as ``engine``, ``db``, ...) gets itself on PYTHONPATH instead.
    The links live inside the tree and go with it."""
    env = dict(os.environ if env is None else env)
    if "kvscope.app" not in (tree / "pyproject.toml").read_text():
        env["PYTHONPATH"] = str(tree)
        return env
    links = tree / ".bench-imports" / "kvscope"
    links.mkdir(parents=True, exist_ok=True)
    for layer in LAYERS:
        link = links / layer
        if not link.is_symlink():
            link.symlink_to(tree / layer, target_is_directory=True)
    env["PYTHONPATH"] = str(links.parent)
    return env


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table (it reads fine in a terminal and pastes into the README)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def median(values: list[float]) -> float:
    return statistics.median(values)
