"""One snapshot of a watch run for every view: what the dashboard's page, the
terminal's watch view and the HTML report show, read from the aggregates (never
the raw events) in one place, so the views agree figure for figure."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.db import watch_read as q
from kvscope.db.watch_aggregates import HISTOGRAMS

INCIDENTS_KEPT = 200  # the newest; a flapping source makes thousands
PREFIXES_KEPT = 10


@dataclass(frozen=True, slots=True)
class WatchSnapshot:
    # the current state, the session's totals and the window's counts
    sources: list[q.WatchSource]
    stats: list[q.BlockStats]
    duplication: list[q.Duplication]
    prefixes: list[q.SharedPrefix]  # the largest first
    tree: list[q.TreeSummary]
    misses: list[q.Misses]
    incidents: list[q.Incident]  # in time order, the newest INCIDENTS_KEPT
    window: q.Window | None = None  # None: the whole session
    window_name: str = ""  # one of watch_read.WINDOWS, or how the window was chosen
    # over time (empty where the view draws none: watch_snapshot's ``series``)
    cached_series: list[q.CachedPoint] = ()
    duplicate_series: list[q.DuplicatePoint] = ()
    miss_series: list[q.MissPoint] = ()
    histograms: dict[str, list[q.HistogramBin]] = field(default_factory=dict)
    engines: list[q.EngineSeries] = ()
    residency: dict[str, list[q.HistogramBin]] | None = None  # vLLM's sampled ones, from /metrics
    cache_sources: list[q.CacheSources] = ()
    queue: list[q.MetricPoint] = ()  # the recorder's own back-pressure
    lag: list[q.MetricPoint] = ()


def watch_snapshot(
    source: q.Source,
    run_id: int,
    window: q.Window | None = None,
    window_name: str = "",
    *,
    series: bool = True,
) -> WatchSnapshot:
    """Everything the views show: the window's buckets and scrapes for the series and
    the window's counts, the current state and the session's totals for the rest.
    Without ``series`` (the terminal, which draws no time series) the time series,
    histograms and scrapes are left empty: they are most of a refresh's queries."""
    with q.connection(source) as conn:
        over_time = {}
        if series:
            queue, lag = q.back_pressure(conn, run_id, window)
            over_time = {
                "cached_series": q.cached_series(conn, run_id, window),
                "duplicate_series": q.duplicate_series(conn, run_id, window),
                "miss_series": q.miss_series(conn, run_id, window),
                "histograms": {name: q.histogram(conn, run_id, name) for name in HISTOGRAMS},
                "engines": q.engine_series(conn, run_id, window),
                "residency": q.residency(conn, run_id),
                "cache_sources": q.cache_sources(conn, run_id, window),
                "queue": queue,
                "lag": lag,
            }
        return WatchSnapshot(
            sources=q.watch_sources(conn, run_id),
            stats=q.block_stats(conn, run_id, window),
            duplication=q.duplication(conn, run_id),
            prefixes=q.prefix_tree(conn, run_id, top=PREFIXES_KEPT),
            tree=q.tree_summary(conn, run_id),
            misses=q.misses(conn, run_id, window),
            incidents=q.incidents(conn, run_id, newest=INCIDENTS_KEPT, window=window),
            window=window,
            window_name=window_name,
            **over_time,
        )
