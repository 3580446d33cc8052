"""The ``kvscope`` command line: one argparse parser, one module per subcommand.

Each module in ``app/commands`` adds its own subparser and sets ``handler``.
Errors the user can fix (``KvscopeError``) become one line on stderr and exit
status 2, never a traceback. A mistaken flag is one of them: ``CliParser``
raises a ``UsageError`` (naming the choices or the rule broken) instead of
printing argparse's usage block, so the dashboard, which parses the same flags,
gets an exception it can show rather than a process exit.

Every command's module is imported to build the parser, so what they import at
their top is paid by every command, ``--version`` included: only the standard
library and torch-free kvscope modules (option choices, presets, sizing math).
torch (about 2 s), the UIs (textual, dash, plotly) and the database layer
(sqlite_utils, numpy) are imported by the handler that uses them.
tests/test_startup.py checks that the light commands import none of them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from kvscope.engine.errors import KvscopeError

try:
    from importlib.metadata import version as _dist_version

    VERSION = _dist_version("kvscope")
except Exception:  # a source tree that was never installed
    VERSION = "unknown"


class UsageError(KvscopeError):
    """A flag the parser refused: one line, exit status 2."""


_INVALID_CHOICE = re.compile(r"invalid choice: '(.*)' \(choose from")


class CliParser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line that says where to look for help."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse names an unknown option only once all else parsed; before that, its
        # value read as a command ("kvscope calc --model x": "invalid choice: 'x' (choose
        # from 'offload', 'cliff')") or a missing positional hid it ("kvscope eval
        # --nope": "arguments are required: TASK").
        given = getattr(self, "_given", [])
        # what no command took is the top level's to report: the command's help lists
        # the options there are
        where = self._command_parser(given) if message.startswith("unrecognized") else self
        choice = _INVALID_CHOICE.search(message)
        if choice is not None and choice.group(1) in given:
            at = given.index(choice.group(1))
            if at and self._unknown(given[at - 1]):
                message = f"unrecognized arguments: {given[at - 1]}"
        elif "arguments are required" in message:
            unknown = [arg for arg in given if self._unknown(arg)]
            if unknown:
                message += f"; not an option of {self.prog}: {' '.join(unknown)}"
        raise UsageError(f"{message} (see {where.prog} --help)")

    def _command_parser(self, given: list[str]) -> argparse.ArgumentParser:
        """The (sub)command's parser ``given`` names: the top level reports what no
        command took, and ``kvscope run --no-tui`` had said "see kvscope --help", not
        "kvscope run --help", where --headless is."""
        parser: argparse.ArgumentParser = self
        for arg in given:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if subs and arg in subs[0].choices:
                parser = subs[0].choices[arg]
        return parser

    def _unknown(self, arg: str) -> bool:
        """``arg`` reads as an option this parser lacks (by its name or an abbreviation)."""
        name = arg.split("=", 1)[0]
        if not name.startswith("-") or name == "-" or self._negative_number_matcher.match(name):
            return False
        known = self._option_string_actions
        return name not in known and not (
            name.startswith("--") and any(s.startswith(name) for s in known)
        )

    def format_help(self) -> str:
        # Descriptions are the modules' docstrings, whose ``code`` marks are for readers of
        # the source; a terminal shows plain names.
        return super().format_help().replace("``", "")


def _undecodable(argv: list[str]) -> str | None:
    """The first argument that was not valid UTF-8 (Python maps such bytes to surrogates)."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return repr(arg.encode("utf-8", "surrogateescape"))[2:-1]
    return None


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
    parser = CliParser(
        prog="kvscope",
        description="See what an LLM server's KV cache is really doing.",
    )
    parser.add_argument("--version", action="version", version=f"kvscope {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CliParser)
    for name in COMMANDS:
        # No try/except: a command module that fails to import is a packaging
        # error, and must surface as its real traceback, not as a missing command.
        importlib.import_module(f"kvscope.app.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        bad = _undecodable(argv)
        if bad is not None:
            raise UsageError(f"argument '{bad}' is not valid UTF-8")
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version
        return int(done.code or 0)
    except KvscopeError as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return 2
    if args.command is None:  # bare `kvscope`: the command list
        parser.print_help()
        return 0
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
    except OSError as exc:  # a path given that cannot be read or written (a directory, ...)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvscope: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
