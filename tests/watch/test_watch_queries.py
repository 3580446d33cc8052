"""Derived watch queries on a hand-built recording whose every figure is known."""

from __future__ import annotations

import math
import random

from kvscope.db import watch_read as q
from kvscope.db.store import open_db
from kvscope.db.watch_batch import WatchBatch
from kvscope.profiler.watch.writer import WatchWriter

from support import long_recording
from support.watch_helpers import A, B, C, new_watch_run


def test_block_stats(recording) -> None:
    path, run_id = recording
    first, second, third = q.block_stats(path, run_id)
    assert (first.stored, first.removed, first.reannounced, first.recomputed) == (8, 1, 1, 1)
    assert (first.clears, first.resets, first.removed_unknown) == (1, 0, 0)
    assert first.cached == {"GPU": 1} == first.copies  # only E after the clear
    assert (first.lifetime_count, first.lifetime_mean_s) == (1, 2.0)  # A: stored 1 s, removed 3 s
    # The quantiles come from quarter-octave bins: 2 s lies in [1.72, 2.05) s.
    assert 1.72 <= first.lifetime_p50_s <= 2.05
    assert second.cached == {"GPU": 2} and third.cached == {"GPU": 1}
    # New blocks are prefill paid: A, B, C, D, A again, E on source 0 (B's CPU copy
    # and C's re-announcement are not); both of source 1's were held by source 0.
    assert (first.new_blocks, first.routing_misses) == (6, 1)
    assert (second.new_blocks, second.routing_misses) == (2, 2)
    assert (third.new_blocks, third.routing_misses) == (1, 0)  # sglang: another kind


def test_misses_per_source_and_fleet(recording) -> None:
    path, run_id = recording
    rows = {(m.engine, m.source): m for m in q.misses(path, run_id)}
    fleet = rows[("vllm", None)]
    assert (fleet.new_blocks, fleet.recomputed, fleet.routing_misses, fleet.both) == (8, 1, 3, 1)
    assert (fleet.recomputed_tokens, fleet.routing_miss_tokens) == (16, 48)
    assert fleet.span_s == 8.0 and fleet.per_s(fleet.routing_miss_tokens) == 6.0
    assert fleet.routing_share == 3 / 8
    assert rows[("sglang", None)].routing_misses == 0
    (restore,) = q.histogram(path, run_id, "restore_gap")  # A: removed at 3 s, back at 4 s
    assert restore.count == 1 and restore.low_s <= 1.0 < restore.high_s


def test_cached_series_by_medium(recording) -> None:
    path, run_id = recording
    series = q.cached_series(path, run_id)
    # One point per 1-s bucket, at its end: the blocks held after its last event.
    at = {(p.t_s, p.source, p.medium): p.blocks for p in series}
    assert at[(2.0, 0, "GPU")] == 3
    assert at[(3.0, 0, "GPU")] == 4 and at[(3.0, 0, "CPU")] == 1
    assert at[(4.0, 0, "GPU")] == 3
    assert at[(7.0, 0, "GPU")] == 0 and at[(7.0, 0, "CPU")] == 0  # AllBlocksCleared
    assert at[(8.0, 0, "GPU")] == 1
    # A window reads only the buckets wholly inside it: [3, 5) is the 3 s and 4 s ones.
    shown = q.cached_series(path, run_id, q.Window(3.0, 5.0))
    assert {p.t_s for p in shown} == {4.0, 5.0}
    # At 1 s resolution a second is in when any of it is, as the window's counts have it.
    assert {p.t_s for p in q.cached_series(path, run_id, q.Window(2.5, 3.5))} == {3.0, 4.0}


def test_duplicates_across_replicas_of_one_engine_kind(recording) -> None:
    path, run_id = recording
    series = q.duplicate_series(path, run_id)
    extra = {p.t_s: p.extra_copies for p in series if p.engine == "vllm"}
    # A and B on both vLLM replicas; B's CPU copy on source 0 is not another replica.
    assert extra[2.0] == 2 and extra[3.0] == 2 and extra[4.0] == 1 and extra[5.0] == 2
    assert extra[7.0] == 0  # source 0 cleared its cache
    sglang, vllm = q.duplication(path, run_id)
    assert (vllm.engine, vllm.duplicated_blocks, vllm.extra_copies, vllm.peak_extra_copies) == (
        "vllm",
        0,
        0,
        2,
    )
    assert (sglang.engine, sglang.peak_extra_copies) == ("sglang", 0)


def test_prefix_tree_from_parent_chains(recording) -> None:
    path, run_id = recording
    (top,) = q.prefix_tree(path, run_id)
    assert (top.engine, top.block_hash, top.depth_blocks, top.prefix_tokens) == ("vllm", B, 2, 32)
    assert (top.branches, top.subtree_blocks, top.sources) == (2, 3, (0, 1))
    tree = {t.engine: t for t in q.tree_summary(path, run_id)}
    assert (tree["vllm"].nodes, tree["vllm"].branch_points, tree["vllm"].max_depth) == (5, 1, 3)


def test_block_hashes_view_rebuilds_parents(recording) -> None:
    path, _ = recording
    db = open_db(path)
    rows = db.execute(
        "SELECT block_hash, parent_hash FROM watch_block_hashes WHERE source = 0 AND seq = 0 "
        "ORDER BY position"
    ).fetchall()
    db.conn.close()
    assert rows == [(A, None), (B, A), (C, B)]


def test_counter_rates_survive_resets() -> None:
    points = [q.MetricPoint(float(t), v) for t, v in enumerate([0, 10, 20, 5, 15])]
    assert [p.value for p in q.counter_rate(points)] == [10, 10, 5, 10]
    hits = [q.MetricPoint(float(t), v) for t, v in enumerate([0, 5, 5, 30])]
    queries = [q.MetricPoint(float(t), v) for t, v in enumerate([0, 10, 10, 40])]
    # The idle interval (no queries) has no hit rate rather than a division by zero.
    assert [(p.t_s, p.value) for p in q.ratio_of_rates(hits, queries)] == [
        (1.0, 0.5),
        (3.0, 25 / 30),
    ]


def test_sglang_hit_rate_sums_cache_sources_over_prompt_tokens(tmp_path) -> None:
    db, run_id = new_watch_run(tmp_path / "s.db")
    rows = []
    for n in range(4):
        ts = n * 1_000_000_000
        rows += [
            (0, ts, "sglang:prompt_tokens_total", 'model_name="m"', 100.0 * n),
            (0, ts, "sglang:cached_tokens_total", 'cache_source="device",model_name="m"', 30.0 * n),
            (0, ts, "sglang:cached_tokens_total", 'cache_source="host",model_name="m"', 10.0 * n),
            (0, ts, "sglang:token_usage", 'model_name="m"', 0.5),
            # The per-batch gauge kvscope must not use: it says 0.9 while counters say 0.4.
            (0, ts, "sglang:cache_hit_rate", 'model_name="m"', 0.9),
        ]
    source = (0, "metrics", "sglang", "http://h/metrics", None, None, None, 0)
    WatchWriter(db, run_id).write(WatchBatch(sources=[source], metrics=rows))
    (series,) = q.engine_series(db, run_id)
    db.conn.close()
    assert series.usage_level == "tokens" and [p.value for p in series.usage] == [0.5] * 4
    assert [round(p.value, 9) for p in series.hit_rate] == [0.4, 0.4, 0.4]


def _scrape_text(n: int) -> str:
    lines = ["# TYPE vllm:kv_block_lifetime_seconds histogram"]
    for le, count in (("0.1", 2 * n), ("1.0", 5 * n), ("+Inf", 6 * n)):
        lines.append(f'vllm:kv_block_lifetime_seconds_bucket{{engine="0",le="{le}"}} {count}')
    lines += [
        f'vllm:kv_block_lifetime_seconds_count{{engine="0"}} {6 * n}',
        f'vllm:kv_block_lifetime_seconds_sum{{engine="0"}} {3.0 * n}',
        f'vllm:prompt_tokens_cached_by_source_total{{engine="0",source="local"}} {100 * n}',
        f'vllm:prompt_tokens_cached_by_source_total{{engine="0",source="external"}} {10 * n}',
        f'vllm:external_prefix_cache_queries_total{{engine="0"}} {40 * n}',
        f'vllm:external_prefix_cache_hits_total{{engine="0"}} {10 * n}',
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0"}} {n}',  # not kept
    ]
    return "\n".join(lines) + "\n"


def test_vllm_residency_histograms_and_cache_sources(tmp_path) -> None:
    from kvscope.profiler.watch.scraper import sample_rows

    db, run_id = new_watch_run(tmp_path / "m.db")
    last: dict = {}
    rows = []
    for n in (1, 2, 2, 3):  # the third scrape repeats the second: its buckets are not kept
        rows += sample_rows(0, n * 1_000_000_000 + (n == 2) * len(rows), _scrape_text(n), last)
    names = [r[2] for r in rows]
    assert names.count("vllm:kv_block_lifetime_seconds_bucket") == 9  # 3 changes x 3 buckets
    assert "vllm:time_to_first_token_seconds_bucket" not in names
    source = (0, "metrics", "vllm", "http://h/metrics", None, None, None, 0)
    WatchWriter(db, run_id).write(WatchBatch(sources=[source], metrics=rows))
    hist = q.residency(db, run_id)
    assert [(b.high_s, b.count) for b in hist["lifetime"]] == [
        (0.1, 6),
        (1.0, 9),
        (float("inf"), 3),
    ]
    (cache,) = q.cache_sources(db, run_id)
    db.conn.close()
    assert {k: round(v[-1].value) for k, v in cache.by_source_per_s.items()} == {
        "external": 10,
        "local": 100,
    }
    assert [round(p.value, 6) for p in cache.external_hit_rate][-1] == 0.25
    from kvscope.app.dashboard import watch_page

    fig = watch_page.histograms_figure(hist, watch_page.VLLM_RESIDENCY_TITLE)
    assert list(fig.data[0].y) == [6, 9, 3] and "sampled" in fig.layout.title.text
    lines = watch_page.cache_sources_figure([cache])
    assert sorted(t.name for t in lines.data) == ["0 external", "0 local"]
    assert "hit rate 25.0%" in lines.layout.annotations[0].text


def test_a_window_counts_the_events_inside_it(tmp_path) -> None:
    """Windows at every offset of a 2.5 h recording: the figures are those of the
    events in the window, summed from 1 h, 1 min and 1 s buckets."""
    path = tmp_path / "long.db"
    run_id, events = long_recording.build(path)
    end = int(events[-1].t_s) + 1
    rng = random.Random(5)
    windows = [(0.0, None), (None, None), (59.5, 3661.2), (3600.0, 7200.0), (7199.9, 7200.1)]
    windows += [tuple(sorted(rng.uniform(0, end) for _ in range(2))) for _ in range(30)]
    for start, stop in windows:
        window = q.Window(start, stop)
        lo, hi = math.floor(start or 0), end if stop is None else math.ceil(stop)
        want = long_recording.expected(events, lo, hi)
        got = q.window_counts(path, run_id, window)
        assert {
            s: (c.stored, c.removed, c.recomputed, c.routing_misses) for s, c in got.items()
        } == want
        prefill = long_recording.expected_prefill(events, lo, hi)
        assert {s: (c.new_blocks, c.both) for s, c in got.items()} == prefill
        stats = {s.source: s for s in q.block_stats(path, run_id, window)}
        rows = {m.source: m for m in q.misses(path, run_id, window)}
        fleet = rows[None]
        assert fleet.recomputed == sum(w[2] for w in want.values())
        assert fleet.routing_misses == sum(w[3] for w in want.values())
        assert fleet.span_s == max(min(hi, end) - lo, 1)
        assert fleet.new_blocks == sum(n for n, _ in prefill.values())
        assert fleet.both == sum(b for _, b in prefill.values())
        for src, (stored, removed, recomputed, routing) in want.items():
            assert (stats[src].stored, stats[src].removed, stats[src].routing_misses) == (
                stored, removed, routing,
            )  # fmt: skip
            new = prefill[src][0]
            assert stats[src].new_blocks == rows[src].new_blocks == new
            # the shares are the window's: its misses over its prefill
            assert rows[src].recomputed_share == (recomputed / new if new else None)
            assert rows[src].routing_share == (routing / new if new else None)
            tokens_per_s = routing * long_recording.BLOCK_SIZE / fleet.span_s
            assert rows[src].per_s(rows[src].routing_miss_tokens) == tokens_per_s
    # By hand: the last hour holds 27 whole cycles and no part of another. A cycle is
    # 3 new blocks (2 on source 0, 1 on source 1), 1 recomputed (on 0), 2 routing
    # misses (one on each), 1 both: 16-token blocks over 3,600 s.
    hour = {m.source: m for m in q.misses(path, run_id, q.last_window(path, run_id, 3600))}
    assert [(hour[s].new_blocks, hour[s].recomputed, hour[s].routing_misses, hour[s].both)
            for s in (0, 1, None)] == [(54, 27, 27, 27), (27, 0, 27, 0), (81, 27, 54, 27)]  # fmt: skip
    assert [(hour[s].recomputed_share, hour[s].routing_share) for s in (0, 1, None)] == [
        (0.5, 0.5), (0.0, 1.0), (1 / 3, 2 / 3),
    ]  # fmt: skip
    fleet = hour[None]
    assert fleet.per_s(fleet.recomputed_tokens) == 27 * 16 / 3600 == 0.12
    assert fleet.per_s(fleet.routing_miss_tokens) == 54 * 16 / 3600 == 0.24
    # The whole session as a window agrees with the session's own totals.
    session = {s.source: s for s in q.block_stats(path, run_id)}
    whole = q.window_counts(path, run_id, q.Window())
    assert all(session[s].stored == c.stored and session[s].recomputed == c.recomputed
               for s, c in whole.items())  # fmt: skip
    assert q.last_window(path, run_id, 300) == q.Window(end - 300.0, float(end))
    assert q.last_window(path, run_id, None) is None


def test_window_tiles_cover_exactly() -> None:
    for lo, hi in [(0, 1), (59, 61), (3599, 7201), (5, 5), (61, 3659), (0, 36_000)]:
        tiles = q._tiles(lo, hi)
        seconds = [s for w, a, b in tiles for s in range(a * w, (b + 1) * w)]
        assert seconds == list(range(lo, hi))
        assert len(tiles) <= 5
