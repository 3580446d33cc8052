"""``kvscope tui``: watch a run being recorded by another process, or replay one."""

from __future__ import annotations

import argparse
import sys

from kvscope.app.db_argument import add_db_argument, run_id, viewed_db_path
from kvscope.engine.errors import KvscopeError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tui",
        help="terminal UI: attach to a database being written, or replay a recorded run",
        description=__doc__,
    )
    add_db_argument(p, positional=True, help="the database to watch or replay")
    p.add_argument("--run", type=run_id, metavar="ID", help="the run to show (default: the newest)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="track the newest step as the writer records it (and wait for a first run); "
        "without it the run opens paused at its last step, for replay",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.app.tui import run_tui
    from kvscope.app.tui.data import check_database

    path = viewed_db_path(args)
    check_database(path, args.run, missing_ok=False, no_runs_ok=args.follow)  # its errors first
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # Without one, Textual writes escape codes into a file and waits for keys forever.
        raise KvscopeError(
            "kvscope tui needs a terminal (stdin and stdout); without one, use "
            "kvscope runs, kvscope report or kvscope dash"
        )
    run_tui(path, run_id=args.run, follow=args.follow)
    return 0
