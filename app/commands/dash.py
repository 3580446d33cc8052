"""``kvscope dash``: the browser dashboard of a database, live while a run is recorded.

Listens on 127.0.0.1 unless ``--host`` says otherwise; pages refresh every
``--refresh`` seconds and keep the user's zoom.
"""

from __future__ import annotations

import argparse
import sys

from kvscope.app.db_argument import add_db_argument, viewed_db_path
from kvscope.app.sizing_args import port, positive


def refresh_seconds(text: str) -> float:
    """Seconds between refreshes: at least 0.1 (a browser polling faster only burns CPU)."""
    value = positive(text)
    if value < 0.1 or value > 86400:
        raise argparse.ArgumentTypeError(f"must be 0.1-86400 seconds, got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dash",
        help="browser dashboard (Plotly Dash) of recorded and live runs",
        description=__doc__,
    )
    add_db_argument(p, positional=True, help="the database to show")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    p.add_argument("--port", type=port, default=8050, help="port to listen on (default 8050)")
    p.add_argument(
        "--refresh",
        type=refresh_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often pages check for new data (default 2)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.app.dashboard.server import Server, create_app

    path = viewed_db_path(args)
    server = Server(create_app(path, refresh_ms=int(args.refresh * 1000)), args.host, args.port)
    print(f"kvscope dash: {path} at {server.url} (Ctrl+C to stop)", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"kvscope dash: listening on {args.host}: reachable from other machines",
            file=sys.stderr,
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
