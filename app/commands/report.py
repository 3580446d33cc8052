"""``kvscope report``: one run exported as an HTML page, a Perfetto trace, CSV or JSON.

html: one self-contained file (opens offline) with the summary and main charts.
trace: Chrome Trace Event JSON; open it at ui.perfetto.dev or chrome://tracing.
csv: a directory with one CSV per table (-o names the directory, even as run1.csv).
json: every table in one document, on stdout unless -o names a file.
mooncake: the run's requests as a Mooncake-format trace (page-level hash ids of
each prompt), for ``kvscope replay --block-size PAGE`` at other capacities.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.db_argument import add_db_argument, db_path, run_id
from engine.errors import KvscopeError

FORMATS = ("html", "trace", "csv", "json", "mooncake")


def default_output(run_id: int, fmt: str) -> Path:
    suffix = {
        "html": ".html",
        "trace": ".trace.json",
        "csv": "-csv",
        "json": ".json",
        "mooncake": ".mooncake.jsonl",
    }[fmt]
    return Path(f"kvscope-run{run_id}{suffix}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="export a run: self-contained HTML, Perfetto trace, CSV, JSON or a Mooncake trace",
        description=__doc__,
    )
    add_db_argument(p, positional=True, help="the database to export from")
    p.add_argument(
        "--run", type=run_id, default=None, metavar="ID", help="run id (default: newest)"
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="PATH",
        help="file to write; for csv the DIRECTORY that gets one CSV per table; default "
        "kvscope-run<ID>.html / .trace.json / -csv/ / .mooncake.jsonl, and stdout for json",
    )
    p.add_argument("--format", choices=FORMATS, default="html", help="what to write (default html)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from app.report.html import build_html
    from app.report.tables import json_document, write_csv, write_json
    from app.report.trace import build_trace
    from db.queries import choose_run, reader

    with reader(db_path(args)) as db:
        run_id = choose_run(db, args.run)
        if args.format == "json" and args.output is None:
            json.dump(json_document(db, run_id), sys.stdout, separators=(",", ":"))
            print()
            return 0
        out = args.output or default_output(run_id, args.format)
        if args.format == "mooncake":
            from app.report.mooncake import write_mooncake

            block = write_mooncake(db_path(args), run_id, out)
            print(f"kvscope report: replay it with --block-size {block}", file=sys.stderr)
        elif args.format == "csv":
            if out.exists() and not out.is_dir():
                raise KvscopeError(f"{out} is a file; --format csv writes a directory of CSV files")
            files = write_csv(db, run_id, out)
            print(f"{out}/: a directory of {len(files)} CSV files, one per table")
            return 0
        elif args.format == "json":
            write_json(db, run_id, out)
        else:
            text = (
                build_html(db, run_id)
                if args.format == "html"
                else json.dumps(build_trace(db, run_id))
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            _write(out, text)
    print(out)
    return 0


def _write(out: Path, text: str) -> None:
    """``text`` into ``out``; a write that fails after the file opened (a full disk,
    /proc) had been only its reason ("No space left on device"): the path with it."""
    try:
        out.write_text(text)
    except OSError as exc:
        raise KvscopeError(f"cannot write {out}: {exc.strerror or exc}") from None
