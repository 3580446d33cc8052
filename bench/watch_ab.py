"""``bench/watch_rate.py`` of this tree against another revision, run alternately.

This 2-core machine's speed swings by up to a third within minutes, so a
rate measured now is not comparable with one measured an hour ago. This runs
the same script from a temporary ``git worktree`` of ``REV`` and from this
tree, one after the other for ``--rounds`` rounds, and prints each one's
median and range of block events/s (recorded, and to the last commit): the
comparison docs/watch.md and the README give.

    .venv/bin/python bench/watch_ab.py REV [--rounds 10] [--this-bench] [-- watch_rate.py args]

``--this-bench`` runs this tree's benchmark scripts (``bench/``) in both, so a
workload added since REV (``--workload fleet``) measures REV's code too.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parents[1]
RATE = re.compile(r"kvscope watch \(recorded\): ([\d,]+) block events/s")
COMMIT = re.compile(r"to the last commit: ([\d,]+) block events/s")


def _run(tree: Path, extra: list[str]) -> tuple[float, float | None]:
    """One watch_rate.py run from ``tree``: (recorded, to the last commit) block events/s."""
    env = None if tree == ROOT else common.code_env(tree)  # that tree's code, not the installed
    out = subprocess.run(
        [sys.executable, str(tree / "bench" / "watch_rate.py"), *extra],
        cwd=ROOT, capture_output=True, text=True, check=True, env=env,
    ).stdout  # fmt: skip
    rate = RATE.search(out)
    if rate is None:
        raise SystemExit(f"no rate in watch_rate.py's output from {tree}:\n{out}")
    commit = COMMIT.search(out)
    return (
        float(rate.group(1).replace(",", "")),
        None if commit is None else float(commit.group(1).replace(",", "")),
    )


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the revision to compare this tree with")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--this-bench", action="store_true", help="this tree's bench/ scripts in REV's tree too"
    )
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: watch_rate.py's
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(other), args.rev],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        if args.this_bench:
            for script in (ROOT / "bench").glob("*.py"):
                shutil.copy(script, other / "bench" / script.name)
        try:
            results: dict[str, list[tuple[float, float | None]]] = {args.rev: [], "this tree": []}
            for i in range(args.rounds):
                for name, tree in ((args.rev, other), ("this tree", ROOT)):
                    results[name].append(_run(tree, extra))
                    print(f"round {i + 1} {name}: {results[name][-1][0]:,.0f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT)
    print(f"block events/s, median (range) of {args.rounds} alternating rounds:")
    for name, runs in results.items():
        commits = [c for _, c in runs if c is not None]
        line = f"  {name}: recorded {_summary([r for r, _ in runs])}"
        if commits:
            line += f", to the last commit {_summary(commits)}"
        print(line)


if __name__ == "__main__":
    main()
