"""One convention for the database argument of every command that reads or writes one.

Commands whose main object is a database (``runs``, ``tui``, ``dash``,
``report``) take it as an optional positional ``DB``; every command also
accepts ``--db PATH`` (``run`` and ``simulate``, whose main object is a
workload, only that). Without either: ``$KVSCOPE_DB``, else ``./kvscope.db``.
``simulate`` records only when asked: a bare ``--db`` means the default file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvscope.engine.errors import KvscopeError

DEFAULT_NOTE = "default: $KVSCOPE_DB or ./kvscope.db"


def add_db_argument(
    parser: argparse.ArgumentParser, *, positional: bool, help: str, opt_in: bool = False
) -> None:
    """``DB`` and ``--db PATH`` (``positional``), or ``--db PATH`` alone; ``help`` says what
    the command does with the database. ``opt_in``: no database unless ``--db`` is given,
    and a bare ``--db`` names the default one."""
    if positional:
        parser.add_argument("db", nargs="?", metavar="DB", help=f"{help} ({DEFAULT_NOTE})")
        parser.add_argument("--db", dest="db_option", metavar="PATH", help="the same as DB")
    elif opt_in:
        parser.add_argument(
            "--db", nargs="?", const="", metavar="PATH", help=f"{help} (bare --db: {DEFAULT_NOTE})"
        )
    else:
        parser.add_argument("--db", metavar="PATH", help=f"{help} ({DEFAULT_NOTE})")


def run_id(text: str) -> int:
    """``--run ID``: a positive integer that SQLite can hold."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run id: {text!r}") from None
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"run ids are positive integers, got {text}")
    return value


def db_path(args: argparse.Namespace) -> Path:
    """The database the command line names, or the default one."""
    # Imported here, not with the module: db.store imports sqlite_utils and numpy (about
    # 0.2 s), and every command's parser is built with this module, --version's included.
    from kvscope.db.store import default_db_path

    given = {path for path in (args.db, getattr(args, "db_option", None)) if path}
    if len(given) > 1:
        raise KvscopeError(f"two databases named ({' and '.join(sorted(given))}): give DB or --db")
    return Path(given.pop()) if given else default_db_path()


def viewed_db_path(args: argparse.Namespace) -> Path:
    """``db_path`` for a command that shows a database: its stale watch runs (left by
    a schema upgrade) folded again first (``app.refold``)."""
    from kvscope.app.refold import refold_stale

    path = db_path(args)
    refold_stale(path)
    return path
