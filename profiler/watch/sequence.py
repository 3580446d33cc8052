"""Per-stream sequence tracking: what a new sequence number means.

Publishers number batches from 0 per process, with no epoch: a number below the
last one seen means the engine restarted; one above the next expected means
batches were lost on the way (ZMQ drops at its high-water mark) and should be
asked for again over the replay socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(Enum):
    NEXT = "next"  # the expected batch (or the first one seen)
    GAP = "gap"  # batches [expected, seq) are missing
    RESTART = "restart"  # the publisher started again from 0
    DUPLICATE = "duplicate"  # already seen (a replay overlapping the live stream)


@dataclass(slots=True)
class SequenceTracker:
    """The last sequence number accepted on one stream."""

    last: int | None = None

    @property
    def expected(self) -> int:
        return 0 if self.last is None else self.last + 1

    def classify(self, seq: int) -> Verdict:
        if self.last is None or seq == self.last + 1:
            return Verdict.NEXT
        if seq > self.last + 1:
            return Verdict.GAP
        if seq == self.last:
            return Verdict.DUPLICATE
        return Verdict.RESTART

    def accept(self, seq: int) -> None:
        self.last = seq

    def reset(self) -> None:
        """Forget the stream (after a restart): sequence 0 is next."""
        self.last = -1
