"""Fixtures for the watch tests: in-process publishers on loopback and a waiting helper."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from profiler.watch.publisher import EventPublisher


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail the test if it never does."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def publishers() -> Iterator[Callable[..., EventPublisher]]:
    """Make publishers (closed at the end of the test)."""
    made: list[EventPublisher] = []

    def make(endpoint: str = "tcp://127.0.0.1:*", **kwargs) -> EventPublisher:
        pub = EventPublisher(endpoint, **kwargs)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close()
