"""Read queries over a watched deployment (run kind ``watch``), for every front end.

Block-level figures come from one ordered pass over ``watch_blocks`` (one
row per event, hashes as JSON) that
replays each source's cache (``replay``): cached blocks by medium over time,
lifetimes from stored to removed, re-announced (reused) blocks, blocks
recomputed after an eviction, clears and restarts, and blocks held by several
replicas at once. Memory is bounded by what the engines cache, not by the
length of the run. Hashes compare only within one engine kind, so every
cross-source figure groups by ``engine``. /metrics figures are rates of
counters between scrapes (never an engine's own hit-rate gauge, which SGLang
overwrites per batch). Times are seconds since the run's start (``t_s``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from db.source import Source, connection, run_origin
from db.watch_schema import OP_CLEARED, OP_REMOVED, OP_RESET, OP_STORED

# Removed blocks remembered per source to recognise one stored again (churn).
EVICTED_MEMORY = 1_000_000

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
class WatchSource:
    """One row of ``watch_sources``."""

    source: int
    kind: str
    engine: str
    endpoint: str
    replay: str | None
    topic: str | None
    dp_rank: int | None
    listen: bool
    block_size: int | None
    last_seq: int | None
    batches: int
    events: int
    block_events: int
    gaps: int
    recovered_batches: int
    lost_batches: int
    restarts: int
    disconnects: int
    bad_messages: int
    attrs: str | None

    @property
    def label(self) -> str:
        rank = "" if self.dp_rank is None else f" dp{self.dp_rank}"
        return f"{self.source}: {self.endpoint}{rank}"


def watch_sources(source: Source, run_id: int) -> list[WatchSource]:
    names = ", ".join(f.name for f in WatchSource.__dataclass_fields__.values())
    with connection(source) as conn:
        rows = conn.execute(
            f"SELECT {names} FROM watch_sources WHERE run_id = ? ORDER BY source", (run_id,)
        ).fetchall()
    return [WatchSource(*row[:7], bool(row[7]), *row[8:]) for row in rows]


# --- the cache replay ----------------------------------------------------------------


@dataclass(slots=True)
class SourceCache:
    """One source's cache as replayed, and what happened to it."""

    cached: dict[tuple[str | None, int], int] = field(default_factory=dict)  # -> stored ts_ns
    # Recently removed keys, oldest first, at most EVICTED_MEMORY of them: a
    # store of one of these is churn. Bounded, so a long watch replays in bounded memory.
    evicted: dict[tuple[str | None, int], None] = field(default_factory=dict)
    stored: int = 0
    removed: int = 0
    reannounced: int = 0  # stored while already cached: a hit re-announced (report mode full)
    recomputed: int = 0  # stored again after being removed: eviction churn
    removed_unknown: int = 0  # removed without a store seen (stored before the watch began)
    clears: int = 0
    resets: int = 0
    lifetimes_ns: list[int] = field(default_factory=list)
    by_medium: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    media_of: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # hash -> media

    def store(self, key: tuple[str | None, int], ts_ns: int) -> bool:
        """Cache ``key``; True when its hash was on no medium of this source before."""
        self.cached[key] = ts_ns
        self.by_medium[key[0]] += 1
        self.media_of[key[1]] += 1
        return self.media_of[key[1]] == 1

    def remove(self, key: tuple[str | None, int]) -> bool:
        """Drop ``key`` (cached); True when its hash is now on no medium of this source."""
        del self.cached[key]
        self.by_medium[key[0]] -= 1
        self.media_of[key[1]] -= 1
        if self.media_of[key[1]]:
            return False
        del self.media_of[key[1]]
        return True

    def clear(self) -> list[int]:
        """Drop everything; returns the hashes this source no longer holds."""
        hashes = list(self.media_of)
        self.cached.clear()
        for medium in self.by_medium:  # kept at 0 so a chart's line drops to 0
            self.by_medium[medium] = 0
        self.media_of.clear()
        self.evicted.clear()
        return hashes


@dataclass(frozen=True, slots=True)
class CachedPoint:
    """Cached blocks of one source and medium at ``t_s``."""

    t_s: float
    source: int
    medium: str | None
    blocks: int


@dataclass(frozen=True, slots=True)
class DuplicatePoint:
    """Blocks of one engine kind held by more than one source at ``t_s``."""

    t_s: float
    engine: str
    duplicated_blocks: int  # distinct hashes on >= 2 sources
    extra_copies: int  # copies beyond the first: the wasted ones


@dataclass(slots=True)
class Replay:
    """What ``replay`` found: per-source caches at the end and the series over time."""

    caches: dict[int, SourceCache]
    cached_series: list[CachedPoint]
    duplicate_series: list[DuplicatePoint]
    final_holders: dict[tuple[str, int], set[int]]  # (engine, hash) -> sources holding it
    peak_extra_copies: dict[str, int]  # engine -> the most extra copies at any moment


def replay(source: Source, run_id: int, *, points: int = 400) -> Replay:
    """Replay every source's block events in arrival order.

    The series hold at most about ``points`` samples each (a sample after every
    ``n``-th event, and the last state).
    """
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        engines = dict(
            conn.execute(
                "SELECT source, engine FROM watch_sources WHERE run_id = ?", (run_id,)
            ).fetchall()
        )
        total = conn.execute(
            "SELECT COUNT(*) FROM watch_blocks WHERE run_id = ?", (run_id,)
        ).fetchone()[0]  # events: a sample after every n-th
        every = max(1, total // max(points, 1))
        caches: dict[int, SourceCache] = defaultdict(SourceCache)
        holders: dict[tuple[str, int], set[int]] = defaultdict(set)
        extra = defaultdict(int)  # engine -> copies beyond the first, right now
        peak = defaultdict(int)
        dup_hashes = defaultdict(int)  # engine -> hashes on >= 2 sources
        cached_series: list[CachedPoint] = []
        duplicate_series: list[DuplicatePoint] = []

        def hold(engine: str, block: int, src: int, add: bool) -> None:
            key = (engine, block)
            owners = holders[key]
            before = len(owners)
            if add:
                owners.add(src)
            else:
                owners.discard(src)
            after = len(owners)
            if after != before:
                extra[engine] += max(after - 1, 0) - max(before - 1, 0)
                peak[engine] = max(peak[engine], extra[engine])
                dup_hashes[engine] += (after >= 2) - (before >= 2)
            if not owners:
                del holders[key]

        def sample(t_ns: int) -> None:
            t_s = (t_ns - origin) / 1e9
            for src, cache in caches.items():
                for medium, n in cache.by_medium.items():
                    cached_series.append(CachedPoint(t_s, src, medium, n))
            for engine in set(engines.values()):
                duplicate_series.append(
                    DuplicatePoint(t_s, engine, dup_hashes[engine], extra[engine])
                )

        rows = conn.execute(
            "SELECT source, ts_ns, op, block_hashes, medium FROM watch_blocks "
            "WHERE run_id = ? ORDER BY rowid",
            (run_id,),
        )
        i = 0
        ts_ns = origin
        for src, ts_ns, op, hashes, medium in rows:
            cache = caches[src]
            engine = engines.get(src, "")
            if op == OP_STORED:
                for block in json.loads(hashes):
                    key = (medium, block)
                    cache.stored += 1
                    if key in cache.cached:
                        cache.reannounced += 1
                        continue
                    if key in cache.evicted:
                        cache.recomputed += 1
                        del cache.evicted[key]
                    if cache.store(key, ts_ns):
                        hold(engine, block, src, True)
            elif op == OP_REMOVED:
                for block in json.loads(hashes):
                    key = (medium, block)
                    cache.removed += 1
                    stored_ns = cache.cached.get(key)
                    if stored_ns is None:
                        cache.removed_unknown += 1
                    else:
                        cache.lifetimes_ns.append(ts_ns - stored_ns)
                        if cache.remove(key):
                            hold(engine, block, src, False)
                    cache.evicted[key] = None
                    if len(cache.evicted) > EVICTED_MEMORY:
                        del cache.evicted[next(iter(cache.evicted))]
            elif op in (OP_CLEARED, OP_RESET):
                if op == OP_CLEARED:
                    cache.clears += 1
                else:
                    cache.resets += 1
                for held in cache.clear():
                    hold(engine, held, src, False)
            i += 1
            if i % every == 0:
                sample(ts_ns)
        if i % every:
            sample(ts_ns)
    return Replay(dict(caches), cached_series, duplicate_series, dict(holders), dict(peak))


@dataclass(frozen=True, slots=True)
class BlockStats:
    """One source's block figures over the whole watch."""

    source: int
    stored: int
    removed: int
    reannounced: int
    recomputed: int
    removed_unknown: int
    clears: int
    resets: int
    cached: dict[str | None, int]  # at the end, by medium
    lifetime_count: int
    lifetime_mean_s: float | None
    lifetime_p50_s: float | None
    lifetime_p90_s: float | None


def block_stats(result: Replay) -> list[BlockStats]:
    """Per-source figures of a ``replay`` result, in source order."""
    stats = []
    for src in sorted(result.caches):
        cache = result.caches[src]
        life = np.asarray(cache.lifetimes_ns, dtype=np.float64) / 1e9
        has = len(life) > 0
        stats.append(
            BlockStats(
                src,
                cache.stored,
                cache.removed,
                cache.reannounced,
                cache.recomputed,
                cache.removed_unknown,
                cache.clears,
                cache.resets,
                {m: n for m, n in cache.by_medium.items() if n},
                len(life),
                float(life.mean()) if has else None,
                float(np.percentile(life, 50)) if has else None,
                float(np.percentile(life, 90)) if has else None,
            )
        )
    return stats


@dataclass(frozen=True, slots=True)
class Duplication:
    """Blocks of one engine kind cached on several sources at the end of the watch."""

    engine: str
    duplicated_blocks: int
    extra_copies: int
    extra_tokens: int | None  # extra copies x block size, when every source reported one
    peak_extra_copies: int


def duplication(source: Source, run_id: int, result: Replay) -> list[Duplication]:
    """Duplicated KV across replicas, per engine kind (wasted bytes = extra_tokens x
    the model's KV bytes per token)."""
    sources = {s.source: s for s in watch_sources(source, run_id)}
    out = []
    for engine in sorted({s.engine for s in sources.values() if s.kind == "events"}):
        held = [(h, owners) for (e, h), owners in result.final_holders.items() if e == engine]
        dup = [(h, owners) for h, owners in held if len(owners) >= 2]
        extra = sum(len(owners) - 1 for _, owners in dup)
        sizes = [sources[s].block_size for _, owners in dup for s in list(owners)[1:]]
        tokens = sum(sizes) if all(size is not None for size in sizes) else None
        peak = result.peak_extra_copies.get(engine, 0)
        out.append(Duplication(engine, len(dup), extra, tokens, peak))
    return out


# --- the prefix tree -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """A block where sequences diverge: the prefix up to it is shared by ``branches``."""

    engine: str
    block_hash: int  # signed 64-bit, as stored
    depth_blocks: int  # blocks from the root to this one, inclusive
    prefix_tokens: int | None
    branches: int  # children: continuations that share the prefix
    subtree_blocks: int  # blocks stored under it (it included)
    sources: tuple[int, ...]  # sources that stored it


def prefix_tree(source: Source, run_id: int, *, top: int = 10) -> list[SharedPrefix]:
    """The largest shared prefixes, rebuilt from ``parent_hash`` chains of every
    block ever stored: branch points ranked by the tokens their prefix spans
    times the extra continuations sharing it (what prefix caching saves there)."""
    with connection(source) as conn:
        rows = conn.execute(
            """SELECT s.engine, b.block_hashes, b.parent_hash, b.source, s.block_size
               FROM watch_blocks b JOIN watch_sources s
                 ON s.run_id = b.run_id AND s.source = b.source
               WHERE b.run_id = ? AND b.op = ?""",
            (run_id, OP_STORED),
        ).fetchall()
    out: list[SharedPrefix] = []
    by_engine: dict[str, list[tuple]] = defaultdict(list)
    for row in rows:
        by_engine[row[0]].append(row[1:])
    for engine, blocks in by_engine.items():
        parent: dict[int, int | None] = {}
        holders: dict[int, set[int]] = defaultdict(set)
        block_size: dict[int, int | None] = {}
        for hashes, par, src, size in blocks:
            for block in json.loads(hashes):
                parent.setdefault(block, par)
                holders[block].add(src)
                block_size[block] = size
                par = block
        children: dict[int, list[int]] = defaultdict(list)
        for block, par in parent.items():
            if par is not None and par != block:
                children[par].append(block)
        depth = _depths(parent)
        subtree = _subtree_sizes(parent, children)
        for block, kids in children.items():
            if len(kids) < 2 or block not in parent:
                continue
            size = block_size.get(block)
            out.append(
                SharedPrefix(
                    engine,
                    block,
                    depth[block],
                    None if size is None else depth[block] * size,
                    len(kids),
                    subtree[block],
                    tuple(sorted(holders[block])),
                )
            )
    out.sort(key=lambda p: (p.depth_blocks * (p.branches - 1), p.subtree_blocks), reverse=True)
    return out[:top]


def _depths(parent: dict[int, int | None]) -> dict[int, int]:
    """Blocks from the root, iteratively (chains can be thousands of blocks long);
    a parent never seen stored counts as the root's edge."""
    depth: dict[int, int] = {}
    for start in parent:
        chain = []
        node: int | None = start
        while node is not None and node in parent and node not in depth:
            chain.append(node)
            depth[node] = -1  # on the current chain: a cycle stops here
            node = parent[node]
        base = depth.get(node, 0) if node is not None else 0
        base = max(base, 0)
        for block in reversed(chain):
            base += 1
            depth[block] = base
    return depth


def _subtree_sizes(parent: dict[int, int | None], children: dict[int, list[int]]) -> dict[int, int]:
    size = dict.fromkeys(parent, 1)
    # Deepest first, so each child's size is final before it is added to its parent.
    depth = _depths(parent)
    for block in sorted(parent, key=depth.__getitem__, reverse=True):
        par = parent[block]
        if par is not None and par in size and par != block:
            size[par] += size[block]
    return size


# --- /metrics ----------------------------------------------------------------------------


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
    source: Source, run_id: int, name: str, *, metrics_source: int | None = None, mean: bool = False
) -> list[MetricPoint]:
    """A sample name per scrape, summed (or averaged, for ratios) over its label sets."""
    agg = "AVG" if mean else "SUM"
    where = "" if metrics_source is None else f" AND source = {int(metrics_source)}"
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        rows = conn.execute(
            f"SELECT ts_ns, {agg}(value) FROM watch_metrics WHERE run_id = ? AND name = ?{where} "
            "GROUP BY source, ts_ns ORDER BY ts_ns",
            (run_id, name),
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


def engine_series(source: Source, run_id: int) -> list[EngineSeries]:
    """For every /metrics source of the run, its usage, load, hit rate and latencies."""
    out = []
    for src in watch_sources(source, run_id):
        if src.kind != "metrics":
            continue

        def series(
            figure: str, suffix: str = "", mean: bool = False, src: WatchSource = src
        ) -> list[MetricPoint]:
            name = METRIC_NAMES[figure][src.engine] + suffix
            return metric_series(source, run_id, name, metrics_source=src.source, mean=mean)

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


@dataclass(frozen=True, slots=True)
class Incident:
    t_s: float
    source: int
    kind: str
    first_seq: int | None
    last_seq: int | None
    recovered: int
    lost: int
    detail: str | None


def incidents(source: Source, run_id: int) -> list[Incident]:
    """Gaps, restarts, disconnects, bad messages and failed scrapes, in time order."""
    with connection(source) as conn:
        origin = run_origin(conn, run_id)
        rows = conn.execute(
            "SELECT ts_ns, source, kind, first_seq, last_seq, recovered, lost, detail "
            "FROM watch_incidents WHERE run_id = ? ORDER BY ts_ns, rowid",
            (run_id,),
        ).fetchall()
    return [Incident((row[0] - origin) / 1e9, *row[1:]) for row in rows]


def raw_events(source: Source, run_id: int, limit: int = 1000) -> list[dict[str, Any]]:
    """Events or fields this kvscope did not know, as recorded."""
    with connection(source) as conn:
        rows = conn.execute(
            "SELECT source, seq, type, payload FROM watch_raw WHERE run_id = ? "
            "ORDER BY rowid LIMIT ?",
            (run_id, limit),
        ).fetchall()
    return [{"source": s, "seq": q, "type": t, "payload": p} for s, q, t, p in rows]
