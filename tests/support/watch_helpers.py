"""Helpers shared by the watch tests (and the real-vLLM tier): waiting for a
condition, a free loopback port, a new watch run, and the hashes of the hand-built
recording."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable

import pytest
from sqlite_utils import Database

from kvscope.db.store import open_db
from kvscope.db.writer import create_run


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail the test if it never does."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.01)


def new_watch_run(path: str | os.PathLike[str]) -> tuple[Database, int]:
    """A database at ``path`` with a new watch run in it (its clock starting at 0)."""
    db = open_db(path)
    run_id = create_run(
        db, kind="watch", model=None, config={}, hardware={}, versions={},
        started_at=0.0, start_ns=0,
    )  # fmt: skip
    return db, run_id


def free_port(consecutive: int = 1) -> int:
    """A free port, and the ``consecutive - 1`` after it free too (a watch listening for
    DP ranks binds port + rank: the next port had sometimes been another socket's)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + consecutive > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for p in range(port, port + consecutive):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", p))
            except OSError:
                continue
        return port


A, B, C, D, E = 11, -22, 2**63 - 1, -(2**63), 55  # signed, as stored
S = 1_000_000_000  # ns per second
