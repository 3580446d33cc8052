"""What the watch notes about a stream besides its batches: a gap and what its replay
recovered, a restart, a connect or disconnect, a bad message, a failed scrape, a
resume. One type for every producer (the subscriber, the scraper, the recorder),
written as a ``watch_incidents`` row."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IncidentNote:
    kind: str  # gap, restart, connected, disconnected, bad_message, scrape_error, resumed
    first_seq: int | None = None
    last_seq: int | None = None  # None: open-ended (a resume continues after first_seq)
    recovered: int = 0  # batches a gap's replay brought back
    lost: int = 0  # batches the replay buffer no longer held
    detail: str | None = None

    def row(self, source: int, ts_ns: int) -> tuple:
        """The ``watch_incidents`` row (``db.watch_schema.INCIDENT_COLUMNS``)."""
        return (source, ts_ns, self.kind, self.first_seq, self.last_seq, self.recovered,
                self.lost, self.detail)  # fmt: skip
