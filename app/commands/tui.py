"""``kvscope tui``: watch a run being recorded by another process, or replay one."""

from __future__ import annotations

import argparse

from app.db_argument import add_db_argument, db_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tui",
        help="terminal UI: attach to a database being written, or replay a recorded run",
        description=__doc__,
    )
    add_db_argument(p, positional=True, help="the database to watch or replay")
    p.add_argument("--run", type=int, metavar="ID", help="the run to show (default: the newest)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="track the newest step as the writer records it (and wait for a first run); "
        "without it the run opens paused at its last step, for replay",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from app.tui import run_tui

    run_tui(db_path(args), run_id=args.run, follow=args.follow)
    return 0
