"""One ``kvscope watch``: the recorder, the subscriber and the scraper, started
and stopped together, with a status snapshot for the live display."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kvscope.db.schema import COMPLETE, FAILED
from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.incident import IncidentNote
from kvscope.profiler.watch.recorder import WatchRecorder
from kvscope.profiler.watch.scraper import Scraper
from kvscope.profiler.watch.sources import SourceSpec
from kvscope.profiler.watch.subscriber import Subscriber


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
    scrape_errors: int = 0
    scrape_error: str | None = None  # the latest, while a /metrics target is failing
    bad_message: str | None = None  # the latest bad message's reason
    lag_s: float = 0.0  # age of the oldest batch waiting to be written
    # sources this watch connects to that it has not reached yet (ZMQ retries quietly),
    # and the first few of their endpoints
    connecting: int = 0
    connecting_to: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def unreached(streams: list) -> list[str]:
    """Endpoints connected to (not listened on) that have neither connected nor sent."""
    return [s.spec.endpoint for s in streams if not (s.spec.listen or s.connects or s.batches)]


def source_count(streams: list) -> int:
    """Sources as a user counts them: a listening socket's own stream (its bad
    messages and connections) is one only until an engine's stream arrives on it."""
    counted = 0
    idle_listen: set[int] = set()
    busy_listen: set[int] = set()
    for s in streams:
        if not s.spec.listen:
            counted += 1
        elif s.batches:
            counted += 1
            busy_listen.add(id(s.spec))
        else:
            idle_listen.add(id(s.spec))
    return counted + len(idle_listen - busy_listen)


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
        keep_raw_s: float | None = None,
        resume: bool = True,
        freeze_gc: bool = False,
        writer_process: bool | None = None,
    ) -> None:
        if not specs and not metrics_urls:
            raise KvscopeError("nothing to watch: no event source and no /metrics URL")
        # freeze_gc: this process is the watch's own (kvscope watch); its writer then
        # runs in a child process unless writer_process says otherwise.
        self.recorder = WatchRecorder(
            db_path, dict(config or {}), model, keep_raw_s=keep_raw_s, resume=resume,
            freeze_gc=freeze_gc, writer_process=writer_process,
        )  # fmt: skip
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
                source, IncidentNote("scrape_error", detail=detail)
            ),
            scrape_interval_s,
            self.recorder.clock_ns,
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
        never = unreached(streams)
        return WatchStatus(
            sources=source_count(streams),
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
            scrape_errors=self.scraper.errors,
            scrape_error=self.scraper.last_error,
            bad_message=self.recorder.last_bad_message,
            lag_s=self.recorder.lag_s,
            connecting=len(never),
            connecting_to=never[:3],
        )

    def stop(self, status: str = COMPLETE) -> WatchStatus:
        """Stop reading, write what is queued, mark the run ``status``."""
        self.scraper.stop()
        self.subscriber.stop()
        self.recorder.finish(status)
        return self.status()
