"""One snapshot of a watch run for every view: what the dashboard's page, the
terminal's watch view and the HTML report show, read from the aggregates (never
the raw events) in one place, so the views agree figure for figure."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.db import watch_read as q
from kvscope.db.watch_aggregates import HISTOGRAMS

INCIDENTS_KEPT = 200  # the newest; a flapping source makes thousands
PREFIXES_KEPT = 10


@dataclass(frozen=True, slots=True)
class WatchSnapshot:
    sources: list[q.WatchSource]
    cached_series: list[q.CachedPoint]
    duplicate_series: list[q.DuplicatePoint]
    stats: list[q.BlockStats]
    duplication: list[q.Duplication]
    prefixes: list[q.SharedPrefix]  # the largest first
    tree: list[q.TreeSummary]
    misses: list[q.Misses]
    miss_series: list[q.MissPoint]
    histograms: dict[str, list[q.HistogramBin]]
    engines: list[q.EngineSeries]
    incidents: list[q.Incident]  # in time order, the newest INCIDENTS_KEPT
    residency: dict[str, list[q.HistogramBin]] | None = None  # vLLM's sampled ones, from /metrics
    cache_sources: list[q.CacheSources] = ()
    queue: list[q.MetricPoint] = ()  # the recorder's own back-pressure
    lag: list[q.MetricPoint] = ()
    window: q.Window | None = None  # None: the whole session
    window_name: str = ""  # one of watch_read.WINDOWS, or how the window was chosen


def watch_snapshot(
    source: q.Source, run_id: int, window: q.Window | None = None, window_name: str = ""
) -> WatchSnapshot:
    """Everything the views show: the window's buckets and scrapes for the series and
    the window's counts, the current state and the session's totals for the rest."""
    with q.connection(source) as conn:
        return WatchSnapshot(
            q.watch_sources(conn, run_id),
            q.cached_series(conn, run_id, window),
            q.duplicate_series(conn, run_id, window),
            q.block_stats(conn, run_id, window),
            q.duplication(conn, run_id),
            q.prefix_tree(conn, run_id, top=PREFIXES_KEPT),
            q.tree_summary(conn, run_id),
            q.misses(conn, run_id, window),
            q.miss_series(conn, run_id, window),
            {name: q.histogram(conn, run_id, name) for name in HISTOGRAMS},
            q.engine_series(conn, run_id, window),
            q.incidents(conn, run_id, newest=INCIDENTS_KEPT, window=window),
            q.residency(conn, run_id),
            q.cache_sources(conn, run_id, window),
            *q.back_pressure(conn, run_id, window),
            window=window,
            window_name=window_name,
        )
