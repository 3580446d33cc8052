"""/metrics figures: rates of counters between scrapes (never an engine's own
hit-rate gauge, which SGLang overwrites per batch), vLLM's residency histograms, the
cached tokens by source, and the recorder's own back-pressure."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

from kvscope.db.source import Source, connection, run_origin
from kvscope.db.watch_read.blocks import HistogramBin
from kvscope.db.watch_read.sources import WatchSource, watch_sources
from kvscope.db.watch_read.windows import Window, _ns
from kvscope.db.watch_schema import LAG_METRIC, PRESSURE_SOURCE, QUEUE_METRIC

# /metrics names per figure and engine kind (see docs/watch.md).
METRIC_NAMES: dict[str, dict[str, str]] = {
    "usage": {"vllm": "vllm:kv_cache_usage_perc", "sglang": "sglang:token_usage"},
    "running": {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"},
    "waiting": {"vllm": "vllm:num_requests_waiting", "sglang": "sglang:num_queue_reqs"},
    "preemptions": {
        "vllm": "vllm:num_preemptions_total",
        "sglang": "sglang:num_retracted_requests_total",
    },
    "hits": {"vllm": "vllm:prefix_cache_hits_total", "sglang": "sglang:cached_tokens_total"},
    "queries": {
        "vllm": "vllm:prefix_cache_queries_total",
        "sglang": "sglang:prompt_tokens_total",
    },
    "ttft": {
        "vllm": "vllm:time_to_first_token_seconds",
        "sglang": "sglang:time_to_first_token_seconds",
    },
    "itl": {
        "vllm": "vllm:inter_token_latency_seconds",
        "sglang": "sglang:inter_token_latency_seconds",
    },
}


@dataclass(frozen=True, slots=True)
class MetricPoint:
    t_s: float
    value: float


def metric_names(source: Source, run_id: int) -> list[str]:
    with connection(source) as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT DISTINCT name FROM watch_metrics WHERE run_id = ? ORDER BY name", (run_id,)
            )
        ]


def metric_series(
    source: Source,
    run_id: int,
    name: str,
    *,
    metrics_source: int | None = None,
    mean: bool = False,
    window: Window | None = None,
) -> list[MetricPoint]:
    """A sample name per scrape (those in ``window`` only), summed (or averaged, for
    ratios) over its label sets."""
    agg = "AVG" if mean else "SUM"
    where = "" if metrics_source is None else f" AND source = {int(metrics_source)}"
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        lo, hi = _ns(origin, window)
        rows = conn.execute(
            f"SELECT ts_ns, {agg}(value) FROM watch_metrics WHERE run_id = ? AND name = ?{where} "
            "AND ts_ns BETWEEN ? AND ? GROUP BY source, ts_ns ORDER BY ts_ns",
            (run_id, name, lo, hi),
        ).fetchall()
    return [MetricPoint((ts - origin) / 1e9, value) for ts, value in rows]


def counter_rate(points: list[MetricPoint]) -> list[MetricPoint]:
    """Per-second rate between consecutive samples; a drop (an engine restart) starts afresh."""
    out = []
    for before, after in zip(points, points[1:], strict=False):
        dt = after.t_s - before.t_s
        if dt <= 0:
            continue
        delta = after.value - before.value if after.value >= before.value else after.value
        out.append(MetricPoint(after.t_s, delta / dt))
    return out


def ratio_of_rates(
    numerator: list[MetricPoint], denominator: list[MetricPoint]
) -> list[MetricPoint]:
    """rate(numerator) / rate(denominator) at the samples both have (hit rate, mean latency)."""
    den = {p.t_s: p.value for p in counter_rate(denominator)}
    return [
        MetricPoint(p.t_s, p.value / den[p.t_s]) for p in counter_rate(numerator) if den.get(p.t_s)
    ]


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """The /metrics figures of one metrics source, named the same for vLLM and SGLang."""

    source: int
    engine: str
    usage: list[MetricPoint]  # block-level for vLLM, token-level for SGLang
    usage_level: str
    running: list[MetricPoint]
    waiting: list[MetricPoint]
    preemptions_per_s: list[MetricPoint]
    hit_rate: list[MetricPoint]  # rate(hits) / rate(queries), tokens
    ttft_mean_s: list[MetricPoint]
    itl_mean_s: list[MetricPoint]


def engine_series(source: Source, run_id: int, window: Window | None = None) -> list[EngineSeries]:
    """For every /metrics source of the run, its usage, load, hit rate and latencies
    (the scrapes of ``window`` only)."""
    out = []
    for src in watch_sources(source, run_id):
        if src.kind != "metrics":
            continue

        def series(
            figure: str, suffix: str = "", mean: bool = False, src: WatchSource = src
        ) -> list[MetricPoint]:
            name = METRIC_NAMES[figure][src.engine] + suffix
            return metric_series(
                source, run_id, name, metrics_source=src.source, mean=mean, window=window
            )

        out.append(
            EngineSeries(
                src.source,
                src.engine,
                series("usage", mean=True),
                "blocks" if src.engine == "vllm" else "tokens",
                series("running"),
                series("waiting"),
                counter_rate(series("preemptions")),
                ratio_of_rates(series("hits"), series("queries")),
                ratio_of_rates(series("ttft", "_sum"), series("ttft", "_count")),
                ratio_of_rates(series("itl", "_sum"), series("itl", "_count")),
            )
        )
    return out


RESIDENCY_METRICS = {
    "lifetime": "vllm:kv_block_lifetime_seconds_bucket",
    "idle_before_evict": "vllm:kv_block_idle_before_evict_seconds_bucket",
    "reuse_gap": "vllm:kv_block_reuse_gap_seconds_bucket",
}


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels(text: str) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def residency(source: Source, run_id: int) -> dict[str, list[HistogramBin]]:
    """vLLM's sampled residency histograms (``--kv-cache-metrics``) as of each metrics
    source's latest scrape, summed over sources and label sets: per bucket (not
    cumulative), named as kvscope's own (``histogram``). Empty without the flag."""
    out: dict[str, list[HistogramBin]] = {}
    with connection(source) as conn:
        for figure, name in RESIDENCY_METRICS.items():
            # The newest value of every (source, labels) series: buckets are kept
            # only when they change, so each series' own latest row, not one scrape.
            rows = conn.execute(
                # SQLite takes the bare columns from the row of MAX(ts_ns).
                "SELECT labels, value, MAX(ts_ns) FROM watch_metrics WHERE run_id = ? AND "
                "name = ? GROUP BY source, labels",
                (run_id, name),
            ).fetchall()
            cumulative: dict[float, float] = defaultdict(float)
            for labels, value, _ in rows:
                le = _labels(labels).get("le")
                if le is not None:
                    cumulative[math.inf if le == "+Inf" else float(le)] += value
            bins, low, below = [], 0.0, 0.0
            for high in sorted(cumulative):
                bins.append(HistogramBin(low, high, int(cumulative[high] - below)))
                low, below = high, cumulative[high]
            if bins:
                out[figure] = bins
    return out


@dataclass(frozen=True, slots=True)
class CacheSources:
    """vLLM's prompt tokens by where their KV came from, and its external cache."""

    source: int
    by_source_per_s: dict[str, list[MetricPoint]]  # prompt_tokens_cached_by_source rate
    external_hit_rate: list[MetricPoint]  # rate(external hits) / rate(external queries)


def cache_sources(source: Source, run_id: int, window: Window | None = None) -> list[CacheSources]:
    """``vllm:prompt_tokens_cached_by_source_total{source}`` as rates per source label
    and the external prefix cache's hit rate (an offload tier, LMCache), per
    metrics source that reports them (the scrapes of ``window`` only)."""
    out = []
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        lo, hi = _ns(origin, window)
        for (src,) in conn.execute(
            "SELECT source FROM watch_sources WHERE run_id = ? AND kind = 'metrics' "
            "ORDER BY source",
            (run_id,),
        ).fetchall():
            by_label: dict[str, list[MetricPoint]] = defaultdict(list)
            for ts, labels, value in conn.execute(
                "SELECT ts_ns, labels, SUM(value) FROM watch_metrics WHERE run_id = ? AND name = ? "
                "AND source = ? AND ts_ns BETWEEN ? AND ? GROUP BY ts_ns, labels ORDER BY ts_ns",
                (run_id, "vllm:prompt_tokens_cached_by_source_total", src, lo, hi),
            ):
                kind = _labels(labels).get("source", "?")
                by_label[kind].append(MetricPoint((ts - origin) / 1e9, value))
            hits = metric_series(conn, run_id, "vllm:external_prefix_cache_hits_total",
                                 metrics_source=src, window=window)  # fmt: skip
            queries = metric_series(conn, run_id, "vllm:external_prefix_cache_queries_total",
                                    metrics_source=src, window=window)  # fmt: skip
            if by_label or hits:
                out.append(
                    CacheSources(
                        src,
                        {k: counter_rate(v) for k, v in sorted(by_label.items())},
                        ratio_of_rates(hits, queries),
                    )
                )
    return out


def back_pressure(
    source: Source, run_id: int, window: Window | None = None
) -> tuple[list[MetricPoint], list[MetricPoint]]:
    """The recorder's queue depth (batches) and lag (s) when they changed: empty
    when it always kept up."""
    return (
        metric_series(source, run_id, QUEUE_METRIC, metrics_source=PRESSURE_SOURCE, window=window),
        metric_series(source, run_id, LAG_METRIC, metrics_source=PRESSURE_SOURCE, window=window),
    )
