"""The aggregates the watch views read: exact on a synthetic fleet whose true
answer the test knows, equal when folded live or rebuilt from the raw rows,
and cheap to refresh when nothing changed."""

from __future__ import annotations

import random
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from kvscope.app.dashboard import watch_page
from kvscope.app.tui.watch_view import WatchView, misses_text
from kvscope.db import watch_read as q
from kvscope.db.store import open_db
from kvscope.db.watch_aggregates import bin_of, stale_runs
from kvscope.db.watch_batch import WatchBatch
from kvscope.db.watch_schema import OP_CLEARED, OP_REMOVED, OP_STORED
from kvscope.db.watch_snapshot import watch_snapshot
from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.fold import fold as fold_module
from kvscope.profiler.watch.fold import fold_run, refold_stale, removal_memory
from kvscope.profiler.watch.fold.fold import WatchFold
from kvscope.profiler.watch.fold.prefix_tree import Chain, Node
from kvscope.profiler.watch.writer import WatchWriter

from support import long_recording
from support.watch_helpers import S, new_watch_run

BLOCK = 16


def _run(path: Path, sources: int = 3, engine: str = "vllm"):
    db, run_id = new_watch_run(path)
    writer = WatchWriter(db, run_id)
    rows = [(i, "events", engine, f"tcp://h:{i}", None, "", i, 0) for i in range(sources)]
    counters = [(BLOCK, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "{}", i) for i in range(sources)]
    writer.write(WatchBatch(sources=rows, counters=counters))
    return db, writer, run_id


def _row(source: int, t_s: float, op: int, hashes=(), parent=None, medium="GPU"):
    text = None if op == OP_CLEARED else "[" + ",".join(map(str, hashes)) + "]"
    return (source, 0, int(t_s * S), op, text, parent, medium, 0, len(hashes))


def test_misses_on_a_fleet_whose_answer_is_known(tmp_path: Path) -> None:
    db, writer, run_id = _run(tmp_path / "w.db")
    prompt = list(range(100, 110))  # a system prompt of 10 blocks
    turn = list(range(200, 205))
    rows = [
        _row(0, 0.0, OP_STORED, prompt + turn),
        _row(1, 1.0, OP_STORED, prompt),  # 10 routing misses: source 0 holds them
        _row(0, 2.0, OP_REMOVED, turn),
        _row(0, 5.0, OP_STORED, turn, parent=prompt[-1]),  # 5 recomputed, 3 s after
        _row(2, 6.0, OP_STORED, turn, parent=prompt[-1]),  # 5 routing misses
        # Copies, not hashes: stored twice in one batch (two requests computed it in
        # one step), removed twice, gone only at the second.
        _row(1, 7.0, OP_STORED, [300]),
        _row(1, 7.0, OP_STORED, [300]),
        _row(1, 8.0, OP_REMOVED, [300]),
        _row(1, 9.0, OP_REMOVED, [300]),
        _row(1, 9.5, OP_STORED, [300]),  # recomputed 0.5 s after, not a routing miss
        # Removed here while source 1 holds it, stored here again: both misses at once.
        _row(0, 10.0, OP_REMOVED, [prompt[-1]]),
        _row(0, 10.25, OP_STORED, [prompt[-1]], parent=prompt[-2]),
    ]
    writer.write(WatchBatch(blocks=rows[:5]))  # two transactions: state carries over
    writer.write(WatchBatch(blocks=rows[5:]))
    db.conn.close()
    path = tmp_path / "w.db"
    per = {(m.engine, m.source): m for m in q.misses(path, run_id)}
    assert [(per[("vllm", s)].recomputed, per[("vllm", s)].routing_misses) for s in range(3)] == [
        (6, 1),
        (1, 10),
        (0, 5),
    ]
    fleet = per[("vllm", None)]
    assert (fleet.new_blocks, fleet.recomputed, fleet.routing_misses, fleet.both) == (38, 7, 16, 1)
    assert (fleet.recomputed_tokens, fleet.routing_miss_tokens) == (7 * BLOCK, 16 * BLOCK)
    assert fleet.span_s == 11.0  # buckets 0..10 s
    stats = {s.source: s for s in q.block_stats(path, run_id)}
    assert stats[1].reannounced == 1 and stats[1].lifetime_count == 1  # 300 went once
    assert stats[1].cached == {"GPU": 11} == stats[1].copies
    gaps = q.histogram(path, run_id, "restore_gap")
    assert sum(b.count for b in gaps) == 7
    # 5 blocks back after 3 s, one after 0.5 s, one after 0.25 s: the bins say so.
    assert sum(b.count for b in gaps if b.low_s <= 3.0 < b.high_s) == 5
    assert sum(b.count for b in gaps if b.low_s <= 0.5 < b.high_s) == 1
    assert sum(b.count for b in gaps if b.low_s <= 0.25 < b.high_s) == 1
    (dup,) = q.duplication(path, run_id)
    # Now: the prompt's 10 on sources 0 and 1, the turn's 5 on sources 0 and 2.
    assert (dup.duplicated_blocks, dup.extra_copies, dup.extra_tokens) == (15, 15, 15 * BLOCK)


def test_hits_re_announced_are_not_copies(tmp_path: Path) -> None:
    """Report mode full: vLLM re-announces a request's hit blocks as BlockStored, and
    removes each physical block once. Re-announcements in later batches must not
    count as copies, or held blocks drift upward and never go."""
    db, writer, run_id = _run(tmp_path / "w.db", sources=1)
    rows = [
        _row(0, 0.0, OP_STORED, [1, 2, 3]),
        _row(0, 1.0, OP_STORED, [1, 2]),  # a request that hit 1 and 2
        _row(0, 2.0, OP_STORED, [1, 2, 3]),  # and another that hit all three
        _row(0, 2.0, OP_STORED, [4], parent=3),  # its new block
        _row(0, 3.0, OP_REMOVED, [1, 2, 3]),  # evicted: one removal per physical block
    ]
    writer.write(WatchBatch(blocks=rows))
    (stats,) = q.block_stats(db, run_id)
    assert stats.reannounced == 5 and stats.new_blocks == 4
    assert stats.cached == {"GPU": 1} == stats.copies  # only 4 is left, one copy
    assert (stats.lifetime_count, stats.removed_unknown) == (3, 0)
    assert stats.lifetime_mean_s == 3.0
    writer.write(WatchBatch(blocks=[_row(0, 4.0, OP_STORED, [1])]))
    (stats,) = q.block_stats(db, run_id)
    db.conn.close()
    assert stats.recomputed == 1  # gone at 3 s, so stored again it is prefill paid again


def _reference(rows: list[tuple]) -> dict[int, dict[str, int]]:
    """The per-source figures by the definitions, with plain sets: what the
    aggregates must equal. A hash stored again while held is a second physical
    copy when in the batch (timestamp) that stored it, a hit re-announced
    (report mode full, no copy) when later."""
    copies: dict[int, dict] = defaultdict(lambda: defaultdict(int))  # src -> (medium, h) -> n
    born: dict[int, dict] = defaultdict(dict)  # src -> (medium, h) -> stored at
    removed: dict[int, set] = defaultdict(set)
    out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def held(src: int, h: int) -> bool:
        return any(n for (m, x), n in copies[src].items() if x == h)

    for src, _, ts, op, text, _, medium, _, _ in rows:
        hashes = [] if text is None else [int(x) for x in text.strip("[]").split(",") if x]
        stats = out[src]
        if op == OP_CLEARED:
            copies[src].clear()
            removed[src].clear()
            continue
        for h in hashes:
            key = (medium, h)
            if op == OP_STORED:
                if copies[src][key]:
                    stats["reannounced"] += 1
                    if born[src][key] != ts:
                        continue  # re-announced: no new copy
                elif not held(src, h):
                    stats["new"] += 1
                    recomputed = h in removed[src]
                    routing = any(held(o, h) for o in list(copies) if o != src)
                    stats["recomputed"] += recomputed
                    stats["routing"] += routing
                    stats["both"] += recomputed and routing
                    removed[src].discard(h)
                if not copies[src][key]:
                    born[src][key] = ts
                copies[src][key] += 1
            else:
                if not copies[src][key]:
                    stats["unknown"] += 1
                    if not held(src, h):
                        removed[src].add(h)
                    continue
                copies[src][key] -= 1
                if not held(src, h):
                    removed[src].add(h)
    for src in out:
        out[src]["live"] = sum(1 for n in copies[src].values() if n)
    holders: dict[int, int] = defaultdict(int)  # hash -> sources holding it on any medium
    for held_copies in copies.values():
        for h in {x for (_, x), n in held_copies.items() if n}:
            holders[h] += 1
    # the fleet now: hashes held by >= 2 sources, copies beyond the first across sources
    out[-1] = {
        "duplicated": sum(1 for n in holders.values() if n >= 2),
        "extra": sum(n - 1 for n in holders.values()),
    }
    return out


def _random_fleet(seed: int, n: int = 3000) -> list[tuple]:
    """Batches of 1-4 events of one source at one timestamp, as an engine's step sends."""
    rng = random.Random(seed)
    rows = []
    t = 0.0
    while len(rows) < n:
        src = rng.randrange(4)
        t += 0.01
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            medium = "CPU" if rng.random() < 0.15 else "GPU"
            hashes = [rng.randrange(60) for _ in range(rng.randint(1, 4))]
            if r < 0.003:
                rows.append(_row(src, t, OP_CLEARED))
            elif r < 0.55:
                rows.append(_row(src, t, OP_STORED, hashes, medium=medium))
            else:
                rows.append(_row(src, t, OP_REMOVED, hashes, medium=medium))
    return rows


@pytest.mark.parametrize("fleet", ["_random_fleet", "_usual_fleet"])
@pytest.mark.parametrize("seed", [1, 2])
def test_aggregates_equal_the_definitions_on_a_random_fleet(
    tmp_path: Path, fleet: str, seed: int
) -> None:
    """Two random fleets: any event on few hashes and two media (the fold's block-by-block
    paths), and GPU-only fresh chains, some stored again or on another source (its
    whole-event paths): the aggregates are the definitions, live, folded again from the
    raw rows, and refolded after a migration from before the aggregates existed."""
    rows = globals()[fleet](seed)
    path = tmp_path / "w.db"
    db, writer, run_id = _run(path, sources=4)
    for start in range(0, len(rows), 700):
        writer.write(WatchBatch(blocks=rows[start : start + 700]))
        writer.state.check_integrity()
        # the fleet's duplication after each write: its holders as the rows so far say
        now = _reference(rows[: start + 700])[-1]
        assert db.execute(
            "SELECT duplicated, extra_copies FROM watch_fleet WHERE run_id = ?", (run_id,)
        ).fetchone() == (now["duplicated"], now["extra"]), start
    writer.finish("complete", 0)
    truth = _reference(rows)
    del truth[-1]
    got = {s.source: s for s in q.block_stats(db, run_id)}
    both = dict(db.execute("SELECT source, both_misses FROM watch_source_stats WHERE run_id = ?",
                           (run_id,)))  # fmt: skip
    assert sum(want["both"] for want in truth.values()) > 0
    for src, want in truth.items():
        s = got[src]
        assert both[src] == want["both"], src
        assert (s.new_blocks, s.recomputed, s.routing_misses, s.reannounced) == (
            want["new"],
            want["recomputed"],
            want["routing"],
            want["reannounced"],
        ), src
        assert (s.removed_unknown, sum(s.cached.values())) == (want["unknown"], want["live"]), src
    # Folded again from the raw rows (a database from before the aggregates, or a
    # resumed watch): the same tables.
    tables = ("watch_source_stats", "watch_live", "watch_series", "watch_fleet_series",
              "watch_histograms", "watch_fleet", "watch_shared_prefixes")  # fmt: skip

    def dump() -> dict[str, list]:
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}

    live = dump()
    with db.atomic():
        fold_run(db.conn, run_id).check_integrity()
    assert dump() == live
    db.conn.close()
    _as_version_5(path)
    db = open_db(path)  # migrated: the run marked stale, its aggregates empty until refolded
    assert dump() == {t: [] for t in tables}
    assert refold_stale(db.conn) == [run_id]
    assert dump() == live and refold_stale(db.conn) == []
    db.conn.close()


def test_lifetime_and_idle_histograms_bin_each_source_exactly(tmp_path: Path) -> None:
    """Blocks of known lifetimes on three sources, removed both as many-hash events
    (binned at persist from their spans) and one at a time, some re-announced first
    (their idle time then starts at the re-announcement), over two writes: every
    source's lifetime and idle bins are ``bin_of`` of exactly those durations."""
    rng = random.Random(5)
    want: dict[tuple[int, str], list[int]] = defaultdict(list)  # durations in ns
    rows, h = [], 1000
    for src in range(3):
        for k in range(40):
            born = rng.uniform(0, 100)
            n = rng.choice([1, 1, 3, 8])
            hashes = list(range(h, h + n))
            h += n
            life = rng.choice([0.0004, 0.002, 0.3, 1.7, 30.0, 420.0]) * rng.uniform(1, 1.5)
            rows.append(_row(src, born, OP_STORED, hashes))
            last = born
            if k % 5 == 0:  # re-announced (a hit) half-way: idle counts from there
                last = born + life / 2
                rows.append(_row(src, last, OP_STORED, hashes))
            rows.append(_row(src, born + life, OP_REMOVED, hashes))
            gone_ns = _row(src, born + life, OP_REMOVED)[2]
            want[(src, "lifetime")] += [gone_ns - _row(src, born, OP_STORED)[2]] * n
            want[(src, "idle_before_evict")] += [gone_ns - _row(src, last, OP_STORED)[2]] * n
    rows.sort(key=lambda r: r[2])  # in time order, as a stream is
    db, writer, run_id = _run(tmp_path / "w.db", sources=3)
    writer.write(WatchBatch(blocks=rows[: len(rows) // 2]))
    writer.write(WatchBatch(blocks=rows[len(rows) // 2 :]))
    writer.finish("complete", 0)
    got = defaultdict(dict)
    for source, name, b, n in db.execute(
        "SELECT source, name, bin, count FROM watch_histograms WHERE run_id = ?", (run_id,)
    ).fetchall():
        got[(source, name)][b] = n
    for key, durations in want.items():
        bins: dict[int, int] = defaultdict(int)
        for d in durations:
            bins[bin_of(d / S)] += 1
        assert got[key] == dict(bins), key
    db.conn.close()


def test_wider_buckets_are_their_seconds_summed(tmp_path: Path) -> None:
    """The 1 min and 1 h series of a fleet spanning ~5 minutes, written in chunks that
    cut buckets apart: each wider bucket's counts are the sum of its 1 s buckets', its
    live blocks those of its latest one; the fleet's duplication is its latest
    second's and its peak the highest of its seconds'."""
    rows = [(src, seq, ts + S // 10 * i, *rest)
            for i, (src, seq, ts, *rest) in enumerate(_random_fleet(3, 3000))]  # fmt: skip
    assert rows[-1][2] // S > 300  # ~5 minutes: several 1 min buckets
    db, writer, run_id = _run(tmp_path / "w.db", sources=4)
    for start in range(0, len(rows), 700):
        writer.write(WatchBatch(blocks=rows[start : start + 700]))
    writer.finish("complete", 0)
    counts = "stored, removed, recomputed, routing_misses, new_blocks, both_misses"
    series = {}
    for width, bucket, source, medium, live, *values in db.execute(
        f"SELECT width_s, bucket, source, medium, live, {counts} FROM watch_series"
    ).fetchall():
        series[(width, bucket, source, medium)] = (live, values)
    fleet = {(w, b, e): v for w, b, e, *v in db.execute(
        "SELECT width_s, bucket, engine, duplicated, extra_copies, peak_extra_copies "
        "FROM watch_fleet_series"
    ).fetchall()}  # fmt: skip
    assert {w for w, *_ in series} == {w for w, *_ in fleet} == {1, 60, 3600}
    assert len([k for k in series if k[0] == 60]) > 4 * 4
    for width in (60, 3600):
        for (w, bucket, source, medium), (live, values) in series.items():
            if w != width:
                continue
            seconds = sorted((b, v) for (w1, b, s1, m1), v in series.items()
                             if w1 == 1 and b // width == bucket and (s1, m1) == (source, medium))  # fmt: skip
            assert live == seconds[-1][1][0]
            assert values == [sum(col) for col in zip(*(v for _, (_, v) in seconds), strict=True)]
        for (w, bucket, engine), (dup, extra, peak) in fleet.items():
            if w != width:
                continue
            seconds = sorted((b, v) for (w1, b, e1), v in fleet.items()
                             if w1 == 1 and b // width == bucket and e1 == engine)  # fmt: skip
            assert (dup, extra) == tuple(seconds[-1][1][:2])
            assert peak == max(v[2] for _, v in seconds)
    db.conn.close()


def test_evicted_memory_is_bounded_and_forgets_the_oldest(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(removal_memory, "EVICTED_MEMORY", 3)
    db, writer, run_id = _run(tmp_path / "w.db", sources=1)
    rows = [_row(0, 0.0, OP_STORED, [1, 2, 3, 4, 5]), _row(0, 1.0, OP_REMOVED, [1, 2, 3, 4, 5])]
    rows += [_row(0, 2.0, OP_STORED, [1]), _row(0, 2.0, OP_STORED, [5])]
    writer.write(WatchBatch(blocks=rows))
    (stats,) = q.block_stats(db, run_id)
    db.conn.close()
    assert stats.recomputed == 1  # 5 was remembered; 1 was the oldest, forgotten


def test_the_fleet_remembers_its_last_removals_and_counts_those_forgotten(
    tmp_path: Path, monkeypatch
) -> None:
    """One budget for the whole fleet: past it the oldest removals are forgotten first
    (a re-store of one is new prefill, not recomputation), counted per source; one
    re-stored or removed again since is no longer that removal, and forgets nothing."""
    monkeypatch.setattr(removal_memory, "EVICTED_MEMORY", 5)
    db, writer, run_id = _run(tmp_path / "w.db", sources=2)
    rows = [_row(0, 0.0, OP_STORED, [1, 2, 3]), _row(1, 0.0, OP_STORED, [11, 12, 13])]
    rows += [
        _row(0, 1.0, OP_REMOVED, [1, 2, 3]),  # remembered: 3
        _row(1, 2.0, OP_REMOVED, [11, 12, 13, 99]),  # 99 unknown: 7, so 1 and 2 forgotten
        _row(0, 3.0, OP_STORED, [1, 3]),  # 1 forgotten: new; 3 recomputed
        _row(1, 3.0, OP_STORED, [13]),  # recomputed
        _row(0, 4.0, OP_REMOVED, [3]),  # the oldest, 3 at 1 s, was re-stored: nothing lost
        _row(0, 5.0, OP_STORED, [3]),  # recomputed: its removal at 4 s is remembered
        _row(1, 5.0, OP_STORED, [11]),  # recomputed
        _row(0, 6.0, OP_REMOVED, [1, 3]),  # 11 (re-stored) and 12 go: 12 forgotten
        _row(1, 7.0, OP_STORED, [12, 99]),  # 12 forgotten: new; 99 recomputed
    ]
    writer.write(WatchBatch(blocks=rows))

    def stats() -> list[tuple]:
        return db.execute(
            "SELECT source, new_blocks, recomputed, forgotten_removals FROM watch_source_stats "
            "WHERE run_id = ? ORDER BY source",
            (run_id,),
        ).fetchall()

    assert stats() == [(0, 6, 2, 2), (1, 7, 3, 1)]
    shown = q.block_stats(db, run_id)
    assert [(s.recomputed, s.forgotten_removals) for s in shown] == [(2, 2), (3, 1)]
    assert [r["removals forgotten"] for r in watch_page.block_rows(shown)] == [2, 1]
    with db.atomic():
        state = fold_run(db.conn, run_id)  # the raw rows folded again: the same
    assert stats() == [(0, 6, 2, 2), (1, 7, 3, 1)]
    assert state.memory.remembered == 5  # the bound, stale entries included
    assert state.sources[0].evicted == {1: 6 * S, 3: 6 * S} and not state.sources[1].evicted
    db.conn.close()


def _drop_v8_columns(db) -> None:
    """A file as schema 7 left it: ``watch_series`` without migration 8's columns (and
    ``watch_source_stats`` without migration 9's)."""
    db.execute("ALTER TABLE watch_series DROP COLUMN new_blocks")
    db.execute("ALTER TABLE watch_series DROP COLUMN both_misses")
    db.execute("ALTER TABLE watch_source_stats DROP COLUMN forgotten_removals")


def _as_version_5(path: Path) -> None:
    """The file as schema 5 left it: raw rows, no aggregate tables."""
    db = open_db(path)
    db.execute("DROP INDEX IF EXISTS watch_blocks_run")
    for table in ("watch_source_stats", "watch_live", "watch_series", "watch_fleet_series",
                  "watch_fleet", "watch_histograms", "watch_shared_prefixes", "watch_agg_state",
                  "watch_agg_stale"):  # fmt: skip
        db.execute(f"DROP TABLE {table}")
    db.execute("PRAGMA user_version = 5")
    db.conn.commit()
    db.conn.close()


def test_a_migrated_database_gets_its_aggregates(tmp_path: Path, capsys) -> None:
    """A watch recorded before schema 6 (no aggregates): migrating only marks it stale
    (db/ never folds); the first command that shows the file folds it, saying so, and
    then it shows the same figures."""
    from support.cli_runs import run_cli

    path = tmp_path / "old.db"
    db, writer, run_id = _run(path, sources=2)
    writer.write(WatchBatch(blocks=[_row(0, 0.0, OP_STORED, [1, 2]), _row(1, 1.0, OP_STORED, [2])]))
    db.conn.close()
    _as_version_5(path)
    db = open_db(path)
    assert q.block_stats(db, run_id) == [] and stale_runs(db.conn) == [run_id]
    db.conn.close()
    code, _, err = run_cli(capsys, "runs", str(path))
    assert code == 0, err
    assert f"folding watch run {run_id} again (schema upgrade): 2 block rows" in err
    db = open_db(path)
    stats = q.block_stats(db, run_id)
    assert [(s.source, s.new_blocks, s.routing_misses) for s in stats] == [(0, 2, 0), (1, 1, 1)]
    assert stale_runs(db.conn) == []
    db.conn.close()
    assert "folding" not in run_cli(capsys, "runs", str(path))[2]  # once


def _as_version_7(path: Path, *, trim_before_s: int | None = None) -> None:
    """The file as schema 7 wrote it (no per-bucket prefill); ``trim_before_s``: its raw
    rows before then trimmed by --keep-raw, as the writer marks them."""
    db = open_db(path)
    _drop_v8_columns(db)
    if trim_before_s is not None:
        db.execute("DELETE FROM watch_blocks WHERE ts_ns < ?", (trim_before_s * S,))
        db.execute("UPDATE watch_agg_state SET raw_trimmed_before = ?", (trim_before_s * S,))
    db.execute("PRAGMA user_version = 7")
    db.conn.commit()
    db.conn.close()


def test_a_version_7_database_gets_its_windows_shares(tmp_path: Path) -> None:
    """Migration 8 folds a run that holds its raw rows again: its windows' shares of
    prefill are the window's; a run trimmed by --keep-raw keeps them unknown, said so."""
    path, trimmed = tmp_path / "v7.db", tmp_path / "v7-trimmed.db"
    run_id, events = long_recording.build(path)
    long_recording.build(trimmed)
    end = int(events[-1].t_s) + 1
    before = {s.source: s for s in q.block_stats(path, run_id)}
    _as_version_7(path)
    _as_version_7(trimmed, trim_before_s=600)
    db = open_db(path)  # migrates to 8 (marking the run to fold again), 9 and 10
    assert db.execute("PRAGMA user_version").fetchone()[0] == 10
    assert refold_stale(db.conn) == [run_id]
    assert {s.source: s for s in q.block_stats(db, run_id)} == before  # the session unchanged
    for lo, hi in [(0, end), (59, 3661), (end - 900, end), (4321, 4400)]:
        window = q.Window(float(lo), float(hi))
        want = long_recording.expected(events, lo, hi)
        prefill = long_recording.expected_prefill(events, lo, hi)
        rows = {m.source: m for m in q.misses(db, run_id, window)}
        for src, (new, both) in prefill.items():
            recomputed, routing = want[src][2], want[src][3]
            assert (rows[src].new_blocks, rows[src].both) == (new, both)
            assert (rows[src].recomputed_share, rows[src].routing_share) == (
                recomputed / new, routing / new,
            )  # fmt: skip
        fleet_new = sum(n for n, _ in prefill.values())
        assert rows[None].new_blocks == fleet_new
        if fleet_new:
            assert rows[None].routing_share == sum(w[3] for w in want.values()) / fleet_new
    db.conn.close()
    window = q.last_window(trimmed, run_id, 900)
    misses = q.misses(trimmed, run_id, window)
    assert misses and all(m.new_blocks is None and m.recomputed_share is None for m in misses)
    assert all(m.routing_misses >= 0 for m in misses)  # the counts stay: only shares unknown
    assert watch_page.misses_note(misses) == f"In the window: {q.SHARES_UNKNOWN}:"
    assert "recorded before v8" in q.SHARES_UNKNOWN
    assert q.SHARES_UNKNOWN in misses_text(misses, "in the window").plain
    (session,) = [m for m in q.misses(trimmed, run_id) if m.source is None]
    assert session.new_blocks == 3 * len(events) // 6  # the whole session's stats still known


def test_a_version_6_database_still_reads_and_continues(tmp_path: Path) -> None:
    """Schema 6 had a run_id index on watch_blocks; 7 drops it (the writer's insert rate):
    an old file keeps its figures, and a run in it is continued from its raw rows."""
    path = tmp_path / "v6.db"
    db, writer, run_id = _run(path, sources=1)
    writer.write(
        WatchBatch(blocks=[_row(0, 0.0, OP_STORED, [1, 2]), _row(0, 1.0, OP_REMOVED, [1])])
    )
    db.execute("CREATE INDEX watch_blocks_run ON watch_blocks (run_id)")
    _drop_v8_columns(db)
    db.execute("PRAGMA user_version = 6")
    db.conn.commit()
    db.conn.close()
    db = open_db(path)  # migrates to 7
    indexes = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")]
    assert "watch_blocks_run" not in indexes
    (stats,) = q.block_stats(db, run_id)
    assert (stats.new_blocks, stats.cached) == (2, {"GPU": 1})
    writer = WatchWriter(db, run_id)  # continued: the state is rebuilt from the raw rows
    writer.write(WatchBatch(blocks=[_row(0, 2.0, OP_REMOVED, [2]), _row(0, 3.0, OP_STORED, [1])]))
    (stats,) = q.block_stats(db, run_id)
    db.conn.close()
    assert (stats.removed_unknown, stats.recomputed, stats.cached) == (0, 1, {"GPU": 1})


def test_views_cost_nothing_when_nothing_changed(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    db, writer, run_id = _run(path, sources=1)
    writer.write(WatchBatch(blocks=[_row(0, 0.0, OP_STORED, [1, 2])]))
    renderer = watch_page.Renderer(path)
    first = renderer(run_id)
    assert renderer(run_id) is first and renderer.renders == 1
    view = WatchView(path, run_id)
    assert view.refresh_snapshot() is not None and view.refresh_snapshot() is None
    writer.write(WatchBatch(blocks=[_row(0, 1.0, OP_STORED, [3])]))
    db.conn.close()
    assert renderer(run_id) is not first and renderer.renders == 2
    snap = view.refresh_snapshot()
    assert snap is not None and snap.stats[0].cached == {"GPU": 3} and view.refreshes == 2


def test_views_never_read_the_raw_events(tmp_path: Path) -> None:
    """Every view query reads aggregates: with the raw rows gone, the figures stay."""
    path = tmp_path / "w.db"
    db, writer, run_id = _run(path, sources=2)
    writer.write(WatchBatch(blocks=[_row(0, 0.0, OP_STORED, [1, 2]), _row(1, 1.0, OP_STORED, [2])]))
    db.execute("DELETE FROM watch_blocks")
    db.conn.commit()
    db.conn.close()
    conn = sqlite3.connect(path)
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    data = watch_snapshot(conn, run_id)
    conn.close()
    assert [s.new_blocks for s in data.stats] == [2, 1]
    assert not [sql for sql in traced if "watch_blocks" in sql]


def test_the_prefix_tree_forgets_old_unheld_leaves_past_its_bound(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(fold_module, "MAX_TREE_NODES", 10)
    db, writer, run_id = _run(tmp_path / "w.db", sources=1)
    rows = [_row(0, 0.0, OP_STORED, [1, 2, 3])]  # a chain kept held
    rows += [_row(0, 1.0, OP_STORED, [100 + i], parent=3) for i in range(10)]
    rows += [_row(0, 2.0, OP_REMOVED, [100 + i]) for i in range(10)]
    writer.write(WatchBatch(blocks=rows))
    (tree,) = q.tree_summary(db, run_id)
    (top,) = q.prefix_tree(db, run_id)
    db.conn.close()
    assert tree.nodes == 9  # 13 > 10: the 4 oldest unheld leaves went, the held chain stayed
    assert (top.block_hash, top.branches, top.subtree_blocks) == (3, 10, 11)  # counted before


def test_chains_nobody_touched_are_pruned_and_grown_as_nodes(tmp_path, monkeypatch) -> None:
    """An event's new blocks are one record until one of them is needed (a child, a
    prune): the tree is the one its nodes would have made, and a chain no source holds
    is pruned whole (a path of leaves), not only its last block."""
    monkeypatch.setattr(fold_module, "MAX_TREE_NODES", 4)
    monkeypatch.setattr(fold_module, "PREFIX_REFRESH_S", 0.0)  # the ranking at every write
    db, writer, run_id = _run(tmp_path / "w.db", sources=1)
    rows = [_row(0, 0.0, OP_STORED, [1, 2, 3]), _row(0, 1.0, OP_REMOVED, [1, 2, 3])]
    rows += [_row(0, 2.0, OP_STORED, [10, 11])]  # 5 nodes > 4: 2 to go, 1-2-3 held by none
    writer.write(WatchBatch(blocks=rows))
    (tree,) = q.tree_summary(db, run_id)
    assert (tree.nodes, tree.roots, tree.branch_points) == (2, 2, 0)  # roots counted stay
    rows = [_row(0, 3.0, OP_STORED, [20, 21, 22]), _row(0, 4.0, OP_STORED, [4], parent=21)]
    writer.write(WatchBatch(blocks=rows))  # 21 branches; 6 nodes, all held: none to prune
    (tree,) = q.tree_summary(db, run_id)
    (top,) = q.prefix_tree(db, run_id)
    db.conn.close()
    assert (tree.nodes, tree.branch_points, tree.max_depth) == (6, 1, 3)
    assert (top.block_hash, top.depth_blocks, top.branches, top.subtree_blocks) == (21, 2, 2, 3)


def _subtree_reference(rows: list[tuple]) -> tuple[dict[int, tuple[int, int, int]], int]:
    """Every block's (subtree size, depth, children) by their definitions, with plain
    dicts and walks up by the parent's hash, and the roots: a store's blocks are a path
    (block i under block i-1, the first under the event's parent), each new one a
    child of the block before it on that path (a root if that is not in the tree),
    one deeper, and counted in every block above it on that path and in the tree (a
    block already there keeps its own parent)."""
    parent_of: dict[int, int | None] = {}
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    children: dict[int, int] = defaultdict(int)
    roots = 0
    for _, _, _, op, text, parent, *_ in rows:
        if op != OP_STORED:
            continue
        path, up = [], parent
        for h in (int(x) for x in text.strip("[]").split(",")):
            if h not in size:
                parent_of[h], size[h] = (up if up != h else None), 0
                if parent_of[h] in size:
                    children[parent_of[h]] += 1
                    depth[h] = depth[parent_of[h]] + 1
                else:
                    roots += 1
                    depth[h] = 1
                for above in path:  # this event's blocks before it
                    size[above] += 1
                size[h] += 1
                walk, steps = parent_of[path[0]] if path else parent_of[h], 0
                while walk is not None and walk in size and steps <= len(size):
                    size[walk] += 1
                    walk, steps = parent_of[walk], steps + 1
            path.append(h)
            up = h
    return {h: (size[h], depth[h], children[h]) for h in size}, roots


def test_subtree_sizes_are_the_blocks_stored_under_each_block() -> None:
    """Stores under roots, under blocks deep in other chains (made into nodes), under
    the last block of the source's previous store (a chain extended: a session's next
    turn, decode steps), under parents not yet seen (roots whose parent is stored
    later) and of blocks already in the tree: every block's subtree size, walked up by
    parent nodes or by hash."""
    rng = random.Random(5)
    rows, known, fresh = [], [], 1
    last: dict[int, int] = {}  # source -> the last block of its previous store
    announced = iter(range(10**6, 2 * 10**6))
    unseen: list[int] = []  # parents named before they are stored (as roots: no cycle)
    for step in range(1500):
        pick = rng.random()
        parent = None
        if pick < 0.08 and unseen:
            hashes = [unseen.pop(0)]
        else:
            if pick < 0.2:
                parent = next(announced)
                unseen.append(parent)
            elif pick < 0.5 and step % 2 in last:
                parent = last[step % 2]
            elif pick < 0.85 and known:
                parent = rng.choice(known[-200:])
            hashes = list(range(fresh, fresh + rng.choice((1, 1, 2, 6))))
            fresh += len(hashes)
        if known and rng.random() < 0.2:
            hashes.insert(rng.randrange(len(hashes) + 1), rng.choice(known))  # one known
        known += hashes
        last[step % 2] = hashes[-1]
        rows.append(_row(step % 2, step * 0.01, OP_STORED, hashes, parent=parent))
    state = WatchFold(1, 0)
    for source in range(2):
        state.add_source(source, "vllm")
    for start in range(0, len(rows), 300):
        state.apply(rows[start : start + 300])
    want, roots = _subtree_reference(rows)
    tree = state.trees["vllm"]
    nodes = tree.nodes

    def node_of(h: int) -> tuple[int, int, int]:
        node = nodes[h]
        if node.__class__ is Chain:  # untouched: a path, the blocks after it below it
            i, n = node.hashes.index(h), len(node.hashes)
            return n - i, node.depth + i + 1, int(i < n - 1)
        return node.subtree, node.depth, node.children

    assert len(nodes) == len(want) > 3000
    assert max(size for size, _, _ in want.values()) > 50  # deep paths were walked
    assert {h: node_of(h) for h in nodes} == want
    assert tree.roots == roots
    assert tree.max_depth == max(d for _, d, _ in want.values())
    assert tree.branch_points == {h for h, (_, _, c) in want.items() if c >= 2}


def test_a_chain_its_source_stores_under_grows_as_one_record() -> None:
    """A session's next turn and its decode steps under the last block of its chain,
    from the source that stored it, extend the chain; another source's block under it
    or a block under the chain's middle makes its nodes, as the rows say they should."""
    state = WatchFold(1, 0)
    for source in range(2):
        state.add_source(source, "vllm")
    tree = state.trees["vllm"]
    rows = [
        _row(0, 0.0, OP_STORED, [9]),  # a prompt of its own, so the chain hangs below one
        _row(0, 0.1, OP_STORED, [1, 2, 3], parent=9),
        _row(0, 0.2, OP_STORED, [4, 5], parent=3),  # the next turn
        _row(0, 0.3, OP_STORED, [6], parent=5),  # a decode step
    ]
    hash_lists = [[9], [1, 2, 3], [4, 5], [6]]  # as the writer hands them, unpacked
    state.apply(rows, hash_lists)
    assert hash_lists == [[9], [1, 2, 3], [4, 5], [6]]  # the chain has lists of its own
    chain = tree.nodes[1]
    assert chain.__class__ is Chain and chain.hashes == [1, 2, 3, 4, 5, 6]
    assert all(tree.nodes[h] is chain for h in range(1, 7))
    assert (len(tree.nodes), tree.roots, tree.max_depth, tree.branch_points) == (7, 1, 7, set())
    assert tree.nodes[9].subtree == 7  # the prompt and the six blocks under it
    state.apply([_row(1, 0.4, OP_STORED, [7], parent=6)])  # another source: not its chain
    assert tree.nodes[6].__class__ is Node and tree.stored_by(7) == 0b10
    assert (tree.max_depth, tree.nodes[9].subtree, tree.nodes[6].children) == (8, 8, 1)
    state.apply([_row(0, 0.5, OP_STORED, [8], parent=2)])  # a branch in its middle
    assert tree.branch_points == {2} and tree.nodes[2].subtree == 7  # 2 to 8
    state.check_integrity()


def test_keep_raw_trims_raw_rows_and_the_aggregates_survive(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    db, writer, run_id = _run(path, sources=2)
    rows = [_row(i % 2, float(i), OP_STORED, [i, i + 1000]) for i in range(10)]
    rows += [_row(0, 10.0, OP_REMOVED, [0, 2])]
    writer.write(WatchBatch(blocks=rows))
    before = (q.block_stats(db, run_id), q.cached_series(db, run_id), q.misses(db, run_id))
    assert writer.trim_raw(5 * S) == 5  # the rows stored at 0-4 s
    left = db.execute("SELECT MIN(ts_ns), COUNT(*) FROM watch_blocks").fetchone()
    assert left == (5 * S, 6)
    assert (q.block_stats(db, run_id), q.cached_series(db, run_id), q.misses(db, run_id)) == before
    writer.write(WatchBatch(blocks=[_row(1, 11.0, OP_REMOVED, [1])]))  # still folds on
    (_, second) = q.block_stats(db, run_id)
    assert second.lifetime_count == 1 and second.removed_unknown == 0
    # Its cache state cannot be rebuilt from what is left: continuing it says so.
    with pytest.raises(KvscopeError, match="--keep-raw"):
        WatchWriter(db, run_id)
    db.conn.close()


def test_back_pressure_is_recorded_when_batches_wait(tmp_path: Path) -> None:
    import time

    from kvscope.profiler.watch.recorder import WatchRecorder
    from kvscope.profiler.watch.sources import expand_sources
    from kvscope.profiler.watch.subscriber import Stream
    from kvscope.profiler.watch.wire import EventBatch

    recorder = WatchRecorder(tmp_path / "w.db", {})
    stream = Stream(recorder.next_source_index(), expand_sources("tcp://h:1")[0], None, "")
    recorder.new_stream(stream)
    for seq in range(30):  # not started: nothing flushes until asked
        recorder.on_batch(stream, seq, EventBatch(time.time() - 2.0, []))
    assert recorder.queued == 30 and recorder.lag_s >= 2.0
    recorder.flush()
    recorder.flush()  # drained: the drop to 0 is recorded once, then nothing
    recorder.flush()
    queue, lag = q.back_pressure(recorder._db, recorder.run_id)
    recorder.finish()
    assert [p.value for p in queue] == [30.0, 0.0] and lag[0].value >= 2.0
    data = watch_snapshot(tmp_path / "w.db", recorder.run_id)
    fig = watch_page.pressure_figure(data.queue, data.lag)
    assert list(fig.data[0].y) == [30.0, 0.0]


def test_hybrid_groups_are_held_apart(tmp_path: Path) -> None:
    db, writer, run_id = _run(tmp_path / "w.db", sources=1)
    full = _row(0, 0.0, OP_STORED, [1, 2, 3])
    window = (0, 0, 0, OP_STORED, "[1,9]", None, "GPU", 1, 2)  # group 1: a sliding window
    writer.write(WatchBatch(blocks=[full, window, (0, 0, S, OP_REMOVED, "[1]", None, "GPU", 1, 1)]))
    (stats,) = q.block_stats(db, run_id)
    db.conn.close()
    assert stats.by_group == {"GPU/0": 3, "GPU/1": 1} and stats.cached == {"GPU": 4}
    assert stats.new_blocks == 4  # hash 1 in group 1 is not prefill paid again
    (row,) = watch_page.block_rows([stats])
    assert row["by group"] == "GPU/0: 3, GPU/1: 1"


def _usual_fleet(seed: int, steps: int = 1500) -> list[tuple]:
    """GPU-only sources storing fresh chains (some shared across sources, some stored
    again after removal) and removing several held blocks an event: the usual
    event's paths, where the fold takes whole events at once."""
    rng = random.Random(seed)
    held: dict[int, list[int]] = defaultdict(list)
    gone: dict[int, list[int]] = defaultdict(list)
    rows, t, fresh = [], 0.0, 1
    for _ in range(steps):
        src = rng.randrange(4)
        t += rng.choice((0.001, 0.01, 0.5, 3.0))
        pick = rng.random()
        if pick < 0.1 and gone[src]:
            hashes = [gone[src].pop()]  # stored again: recomputation after eviction
        elif pick < 0.2 and held[(src + 1) % 4]:
            hashes = [rng.choice(held[(src + 1) % 4])]  # another source holds it
            if hashes[0] in held[src]:
                continue
        elif pick < 0.3:
            # a chain of both: some stored again, one another source holds, new ones
            hashes = [gone[src].pop() for _ in range(min(len(gone[src]), rng.randint(0, 3)))]
            other = held[(src + 1) % 4]
            if other:
                hashes.append(rng.choice(other))
            hashes += range(fresh, fresh + rng.randint(0, 3))
            fresh += 3
            if not hashes or len(set(hashes)) < len(hashes) or set(hashes) & set(held[src]):
                continue
        else:
            hashes = list(range(fresh, fresh + rng.randint(1, 8)))
            fresh += len(hashes)
        rows.append(_row(src, t, OP_STORED, hashes))
        held[src] += hashes
        if len(held[src]) > 12:
            out = rng.sample(held[src], rng.randint(1, 6))
            held[src] = [h for h in held[src] if h not in out]
            gone[src] += out
            rows.append(_row(src, t, OP_REMOVED, out))
    return rows


def _split_removals(rows: list[tuple]) -> list[tuple]:
    """The same rows with every removal of n hashes as n one-hash removals."""
    out = []
    for row in rows:
        if row[3] != OP_REMOVED or row[8] < 2:
            out.append(row)
            continue
        for h in row[4].strip("[]").split(","):
            out.append((*row[:4], f"[{h}]", None, *row[6:8], 1))
    return out


@pytest.mark.parametrize("fleet", [_usual_fleet, _random_fleet])
def test_a_removal_of_many_hashes_folds_as_that_many_removals(tmp_path: Path, fleet) -> None:
    """Every aggregate, the lifetime and idle histograms included, is the same whether
    an engine removes n blocks in one event (the fold's whole-event path) or in n.
    (Not the shared-prefix ranking: refreshed on a clock, it depends on where the
    transactions fall, and the split rows fall otherwise.)"""
    tables = ("watch_source_stats", "watch_live", "watch_series", "watch_fleet_series",
              "watch_histograms", "watch_fleet")  # fmt: skip
    rows = fleet(3)
    dumps = []
    for name, variant in (("whole", rows), ("split", _split_removals(rows))):
        db, writer, run_id = _run(tmp_path / f"{name}.db", sources=4)
        # Transactions of whole batches (one timestamp), as the recorder writes them.
        chunk: list[tuple] = []
        for i, row in enumerate(variant):
            chunk.append(row)
            if len(chunk) >= 500 and (i + 1 == len(variant) or variant[i + 1][2] != row[2]):
                writer.write(WatchBatch(blocks=chunk))
                chunk = []
        writer.write(WatchBatch(blocks=chunk))
        writer.finish("complete", 0)
        # lifetime_sum_s is a float sum: its last digits depend on the order of adding
        dumps.append({
            t: sorted(tuple(round(v, 6) if isinstance(v, float) else v for v in row)
                      for row in db.execute(f"SELECT * FROM {t}").fetchall())
            for t in tables
        })  # fmt: skip
        db.conn.close()
    assert len(_split_removals(rows)) > len(rows) + 500  # many removals were of several
    lifetimes = [r for r in dumps[0]["watch_histograms"] if r[2] == "lifetime"]
    assert sum(r[4] for r in lifetimes) > 1000
    assert dumps[0] == dumps[1]
