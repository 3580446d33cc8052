"""One ``kvscope watch``: the recorder, the subscriber and the scraper, started
and stopped together, with a status snapshot for the live display."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from db.schema import COMPLETE, FAILED
from engine.errors import KvscopeError
from profiler.watch.recorder import WatchRecorder
from profiler.watch.scraper import Scraper
from profiler.watch.sources import SourceSpec
from profiler.watch.subscriber import Subscriber


@dataclass(slots=True)
class WatchStatus:
    """Totals over every source so far."""

    sources: int
    batches: int
    events: int
    block_events: int
    gaps: int
    recovered_batches: int
    lost_batches: int
    restarts: int
    disconnects: int
    bad_messages: int
    scrapes: int
    queued: int
    rows_written: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class WatchSession:
    """Records ``specs`` (and ``metrics_urls``) into ``db_path`` until ``stop``."""

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        specs: list[SourceSpec],
        *,
        metrics_urls: tuple[str, ...] = (),
        engine: str = "vllm",
        scrape_interval_s: float = 1.0,
        config: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> None:
        self.recorder = WatchRecorder(db_path, dict(config or {}), model)
        try:
            self.subscriber = Subscriber(specs, self.recorder)
        except KvscopeError:
            self.recorder.finish(FAILED)
            raise
        targets = [(self.recorder.add_metrics_source(url, engine), url) for url in metrics_urls]
        self.scraper = Scraper(
            targets,
            self.recorder.on_samples,
            lambda source, detail: self.recorder.add_incident(
                source, "scrape_error", detail=detail
            ),
            scrape_interval_s,
        )

    @property
    def run_id(self) -> int:
        return self.recorder.run_id

    def start(self) -> WatchSession:
        self.recorder.start()
        self.subscriber.start()
        self.scraper.start()
        return self

    @property
    def error(self) -> BaseException | None:
        """Why the subscriber or the writer stopped working, if it did."""
        return self.subscriber.error or self.recorder.error

    def status(self) -> WatchStatus:
        streams = self.subscriber.streams
        return WatchStatus(
            sources=len(streams),
            batches=sum(s.batches for s in streams),
            events=sum(s.events for s in streams),
            block_events=self.recorder.block_events,
            gaps=sum(s.gaps for s in streams),
            recovered_batches=sum(s.recovered_batches for s in streams),
            lost_batches=sum(s.lost_batches for s in streams),
            restarts=sum(s.restarts for s in streams),
            disconnects=sum(s.disconnects for s in streams),
            bad_messages=sum(s.bad_messages for s in streams),
            scrapes=self.scraper.scrapes,
            queued=self.recorder.queued,
            rows_written=self.recorder.rows_written,
        )

    def stop(self, status: str = COMPLETE) -> WatchStatus:
        """Stop reading, write what is queued, mark the run ``status``."""
        self.scraper.stop()
        self.subscriber.stop()
        self.recorder.finish(status)
        return self.status()
