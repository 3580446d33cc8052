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
from typing import TYPE_CHECKING

from kvscope.app.db_argument import add_db_argument, db_path, run_id, viewed_db_path
from kvscope.engine.errors import KvscopeError

if TYPE_CHECKING:
    from sqlite_utils import Database

FORMATS = ("html", "trace", "csv", "json", "mooncake")

# What a watch run (vLLM/SGLang block events, no kernels, no prompts) cannot fill.
NOT_FOR_WATCH = {
    "trace": "a trace holds an engine run's kernels, requests and step counters",
    "mooncake": "a Mooncake trace holds an engine run's prompts",
}


SIDE = ("-wal", "-shm", "-journal")  # SQLite's files beside a database


def output_path(text: str) -> Path:
    """``-o PATH``: an empty one had been the current directory (``--format csv -o ''``
    wrote its CSV files there and exited 0), and ``-o -`` a file named "-"."""
    if not text:
        raise argparse.ArgumentTypeError("give a path, not ''")
    if text == "-":
        raise argparse.ArgumentTypeError(
            "'-' is not stdout here: give a file (json goes to stdout without -o)"
        )
    return Path(text)


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
        type=output_path,
        default=None,
        metavar="PATH",
        help="file to write; for csv the DIRECTORY that gets one CSV per table; default "
        "kvscope-run<ID>.html / .trace.json / -csv/ / .mooncake.jsonl, and stdout for json",
    )
    p.add_argument("--format", choices=FORMATS, default="html", help="what to write (default html)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.app.report.tables import json_document, write_csv, write_json
    from kvscope.db.queries import choose_run, reader, run_info

    with reader(viewed_db_path(args)) as db:
        run_id = choose_run(db, args.run)
        _check_kind(run_info(db, run_id).kind, run_id, args.format)
        if args.format == "json" and args.output is None:
            json.dump(json_document(db, run_id), sys.stdout, separators=(",", ":"))
            print()
            return 0
        out = args.output or default_output(run_id, args.format)
        check_output(out, args.format, db_path(args))  # before a report that may take a while
        try:
            if args.format == "mooncake":
                from kvscope.app.report.mooncake import write_mooncake

                block = write_mooncake(db_path(args), run_id, out)
                print(f"kvscope report: replay it with --block-size {block}", file=sys.stderr)
            elif args.format == "csv":
                files = write_csv(db, run_id, out)
                print(f"{out}/: a directory of {len(files)} CSV files, one per table")
                return 0
            elif args.format == "json":
                write_json(db, run_id, out)
            else:
                out.write_text(_page(db, run_id, args.format))
        except OSError as exc:
            # A write that fails once the file is open (a full disk, /dev/full) had been
            # only its reason for json and mooncake ("No space left on device").
            raise KvscopeError(f"cannot write {out}: {exc.strerror or exc}") from None
    print(out)
    return 0


def _page(db: Database, run_id: int, fmt: str) -> str:
    """The html report or the Chrome trace, as text. Their builders are imported here, not
    with the command: html's imports plotly and the dashboard's pages (dash), which a json
    or csv export (and every other command, whose parser is built with this one) never needs."""
    if fmt == "html":
        from kvscope.app.report.html import build_html

        return build_html(db, run_id)
    from kvscope.app.report.trace import build_trace

    return json.dumps(build_trace(db, run_id))


def check_output(out: Path, fmt: str, database: Path) -> None:
    """Refuse an output path that cannot be written before the report is built: a
    directory where a file goes (or a file where csv's directory goes), a path
    under a file or in a directory that does not exist, or the database being
    reported (or its WAL files: ``-o run.db`` had written the report over the
    recording and then died on a malformed database)."""
    real = database.resolve()  # SQLite names its side files after the file a link leads to
    own = {real, *(real.with_name(real.name + side) for side in SIDE)}
    if out.resolve() in own or (out.exists() and out.samefile(real)):  # a hard link
        raise KvscopeError(
            f"cannot write {out}: it is the database being reported (give another path)"
        )
    if fmt == "csv":
        if out.exists() and not out.is_dir():
            raise KvscopeError(f"{out} is a file; --format csv writes a directory of CSV files")
    elif out.is_dir():
        raise KvscopeError(f"cannot write {out}: it is a directory (give a file name)")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise KvscopeError(f"cannot write {out}: {parent} is a file, not a directory")
            break
    # A mistyped directory had been made, whole tree and all, without a word.
    if not out.parent.is_dir():
        raise KvscopeError(f"cannot write {out}: no directory {out.parent} (make it first)")


def _check_kind(kind: str, run_id: int, fmt: str) -> None:
    """A watch run exported as a trace had been an empty trace, exit 0."""
    if kind == "watch" and fmt in NOT_FOR_WATCH:
        raise KvscopeError(
            f"run {run_id} is a watch run: {NOT_FOR_WATCH[fmt]}; export a watch with "
            "--format html, csv or json"
        )
