"""``kvscope runs``: list the runs a database holds, newest first.

A run whose status is still 'running' but whose writer is gone (killed,
crashed) reads as 'incomplete'. EVENTS is a watch's block events (as its live
line counts them), another run's events written. ``--json`` prints one JSON array.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from kvscope.app.db_argument import add_db_argument, viewed_db_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list the runs recorded in a database", description=__doc__)
    add_db_argument(p, positional=True, help="the database to list")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON array of runs (with config, hardware and versions)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.db.queries import list_runs  # the read layer: sqlite_utils, numpy

    path = viewed_db_path(args)
    runs = list_runs(path)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
        return 0
    if not runs:
        print(f"no runs in {path}")
        return 0
    header = (
        "RUN",
        "KIND",
        "MODEL",
        "STATUS",
        "STARTED",
        "DURATION",
        "REQUESTS",
        "STEPS",
        "EVENTS",
        "DROPPED",
    )
    rows = [
        (
            str(r.run_id),
            r.kind,
            r.subject or "-",
            r.status,
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at)),
            f"{r.duration_s:.1f} s",
            str(r.requests),
            str(r.steps),
            str(r.events),
            str(r.dropped_events),
        )
        for r in runs
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0
