"""The ``kvscope`` command line: one argparse parser, one module per subcommand.

Each module in ``app/commands`` adds its own subparser and sets ``handler``.
Errors the user can fix (``KvscopeError``) become one line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from engine.errors import KvscopeError

# Order is the order shown in --help.
COMMANDS = (
    "run",
    "generate",
    "info",
    "calc",
    "simulate",
    "replay",
    "runs",
    "tui",
    "dash",
    "report",
    "watch",
    "eval",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope",
        description="See what an LLM server's KV cache is really doing.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        # No try/except: a command module that fails to import is a packaging
        # error, and must surface as its real traceback, not as a missing command.
        importlib.import_module(f"app.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KvscopeError as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error for the user.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
