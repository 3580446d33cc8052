"""Read queries over a watched deployment (run kind ``watch``), for every front end,
one module per concept: sources, windows, blocks, metrics, incidents.

Block-level figures read the aggregates the recorder keeps as it writes
(``db.watch_aggregates``), never the raw ``watch_blocks``: a refresh costs the
window it shows, not the length of the watch. Cached blocks and copies by
medium, lifetimes, re-announced blocks, recomputation after eviction and
routing misses, clears and restarts, blocks held by several replicas at once,
the prefix tree's largest shared prefixes. Hashes compare only within one engine kind, so every
cross-source figure groups by ``engine``. /metrics figures are rates of
counters between scrapes (never an engine's own hit-rate gauge, which SGLang
overwrites per batch). Times are seconds since the run's start (``t_s``).
"""

from __future__ import annotations

from kvscope.db.source import Source, connection  # noqa: F401  (what callers pass and open)
from kvscope.db.watch_read.blocks import (  # noqa: F401
    SHARES_UNKNOWN,
    BlockStats,
    CachedPoint,
    DuplicatePoint,
    Duplication,
    HistogramBin,
    Misses,
    MissPoint,
    SharedPrefix,
    TreeSummary,
    _counts_of,
    _histograms,
    _medium,
    _quantile,
    block_stats,
    cached_series,
    duplicate_series,
    duplication,
    histogram,
    miss_series,
    misses,
    prefix_tree,
    tree_summary,
)
from kvscope.db.watch_read.incidents import Incident, incidents, raw_events, seq_range  # noqa: F401
from kvscope.db.watch_read.metrics import (  # noqa: F401
    _LABEL,
    METRIC_NAMES,
    RESIDENCY_METRICS,
    CacheSources,
    EngineSeries,
    MetricPoint,
    _labels,
    back_pressure,
    cache_sources,
    counter_rate,
    engine_series,
    metric_names,
    metric_series,
    ratio_of_rates,
    residency,
)
from kvscope.db.watch_read.sources import WatchSource, attrs_summary, watch_sources  # noqa: F401
from kvscope.db.watch_read.windows import (  # noqa: F401
    WINDOWS,
    Window,
    WindowCounts,
    _bucket_range,
    _bucket_rows,
    _ns,
    _seconds_span,
    _tiles,
    _width,
    _window_seconds,
    last_window,
    named_window,
    version,
    window_counts,
    window_label,
    window_span_s,
)
