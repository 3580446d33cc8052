"""Scrapes engines' Prometheus /metrics at an interval into the watch recorder.

Only ``vllm:`` and ``sglang:`` samples are kept, and of histograms only
``_sum`` and ``_count`` (enough for mean TTFT/ITL over any window; buckets
would multiply the rows by ~20), but for vLLM's three KV residency histograms,
whose buckets are kept when they change. A failed scrape is an incident, not an error:
the engine may be restarting.
"""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

from kvscope.engine.events import now_ns
from kvscope.profiler.watch.prom_text import label_text, parse

PREFIXES = ("vllm:", "sglang:")
TIMEOUT_S = 5.0


def fetch_text(url: str, timeout_s: float = TIMEOUT_S) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read().decode("utf-8", errors="replace")


# vLLM's residency histograms (--kv-cache-metrics): their buckets are kept, when
# they change, so the views can draw them beside kvscope's own from the events.
RESIDENCY = (
    "vllm:kv_block_lifetime_seconds_bucket",
    "vllm:kv_block_idle_before_evict_seconds_bucket",
    "vllm:kv_block_reuse_gap_seconds_bucket",
)


def sample_rows(
    source: int, ts_ns: int, text: str, last_buckets: dict | None = None
) -> list[tuple]:
    """``watch_metrics`` rows for one scrape's text; ``last_buckets`` (kept by the
    caller) drops residency buckets unchanged since the previous scrape."""
    rows = []
    for s in parse(text):
        name = s.name
        if not name.startswith(PREFIXES) or name.endswith("_created"):
            continue
        labels = label_text(s.labels)
        if name.endswith("_bucket"):
            if name not in RESIDENCY:
                continue
            if last_buckets is not None:
                key = (source, name, labels)
                if last_buckets.get(key) == s.value:
                    continue
                last_buckets[key] = s.value
        rows.append((source, ts_ns, name, labels, s.value))
    return rows


class Scraper:
    """Scrapes each (source, url) every ``interval_s`` on one background thread."""

    def __init__(
        self,
        targets: list[tuple[int, str]],
        on_rows: Callable[[list[tuple]], None],
        on_error: Callable[[int, str], None],
        interval_s: float = 1.0,
        clock_ns: Callable[[], int] = now_ns,
    ) -> None:
        self._targets = targets
        self._on_rows = on_rows
        self._on_error = on_error
        self._interval_s = interval_s
        self._clock_ns = clock_ns  # the run's clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[int] = set()
        self._buckets: dict[tuple, float] = {}  # residency buckets as last recorded
        self.scrapes = 0
        self.errors = 0  # failed scrapes, every one (the incidents count outages)
        self.last_error: str | None = None  # while a target is failing, why

    def scrape_once(self) -> None:
        for source, url in self._targets:
            try:
                rows = sample_rows(source, self._clock_ns(), fetch_text(url), self._buckets)
            # HTTPException: a port that answers but not in HTTP (the events' ZMQ port
            # given as --metrics) had ended this thread with a traceback, and the watch
            # had gone on with 0 scrapes and 0 errors.
            except (OSError, ValueError, urllib.error.URLError, http.client.HTTPException) as exc:
                self.errors += 1
                reason = getattr(exc, "reason", None) or exc
                reason = getattr(reason, "strerror", None) or reason
                self.last_error = f"{reason} ({url})"  # the reason first: the line is short
                # One incident per outage, not one per interval.
                if source not in self._failing:
                    self._failing.add(source)
                    self._on_error(source, f"{url}: {exc}")
                continue
            self._failing.discard(source)
            if not self._failing:
                self.last_error = None
            self.scrapes += 1
            self._on_rows(rows)

    def start(self) -> None:
        if not self._targets:
            return
        self._thread = threading.Thread(target=self._run, name="kvscope-watch-scrape", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.scrape_once()
            if self._stop.wait(self._interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
