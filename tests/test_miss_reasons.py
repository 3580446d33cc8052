"""Why prompt tokens missed: the split on a token trace whose true split is known by
construction, run through the real engine (tiny model), recorded and read back; the
tracker's memory bounds.

The trace (page size 4, six device pages, one request at a time, one output token):
A = 1..10 is cold; A again hits its two full pages and misses the partial page's
shared token (granularity) and the last token; A's first six tokens then 50..53
hit one page and diverge inside the second, after two shared tokens; two unrelated
requests then evict A's second page; A once more misses it for lack of capacity.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.app.tui.requests_table import COLUMNS, field_value, row_cells
from kvscope.db.miss_reasons import miss_line, request_miss_reasons, run_miss_reasons
from kvscope.db.requests import requests_at, requests_table
from kvscope.db.source import Position, connection
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import EventBus, PrefixLookup, PrefixMiss
from kvscope.engine.miss_reasons import ROOT_CHAIN, MissReasons, chain_hash
from kvscope.engine.replay.driver import ReplayConfig, ReplayDriver, prepare
from kvscope.engine.replay.traces import read_replay_trace
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import tiny_loaded
from kvscope.profiler.recorder import Recorder

BYTES_PER_TOKEN = 2 * 2 * 8 * 2 * 4  # K+V x kv_heads x head_dim x layers x fp32
A = list(range(1, 11))
TRACE = [A, A, A[:6] + [50, 51, 52, 53], list(range(20, 30)), list(range(30, 40)), A]
# (cold, capacity, granularity, last token) per request, worked out by hand (module docstring).
EXPECTED = [(9, 0, 0, 1), (0, 0, 1, 1), (3, 0, 2, 1), (9, 0, 0, 1), (9, 0, 0, 1), (0, 4, 1, 1)]
HITS = [0, 8, 4, 0, 0, 4]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    db = tmp_path_factory.mktemp("miss") / "run.db"
    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    config = EngineConfig(kv_budget_bytes=6 * 4 * BYTES_PER_TOKEN, page_size=4)
    engine = Engine(config, bus=bus, loaded=tiny_loaded())
    assert engine.kv.pool.num_pages == 6
    recorder = Recorder(db, {"test": "miss_reasons"}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    for prompt in TRACE:  # sequential: each request runs to its end before the next
        engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
            engine.kv.check_integrity()
    recorder.finish("complete")
    return engine, events, db, recorder.run_id


def test_each_request_gets_the_split_known_by_construction(recorded):
    engine, events, _, _ = recorded
    lookups = [e for e in events if isinstance(e, PrefixLookup)]
    misses = [e for e in events if isinstance(e, PrefixMiss)]
    assert [e.hit_tokens for e in lookups] == HITS
    got = [(m.cold_tokens, m.capacity_tokens, m.granularity_tokens, m.last_tokens) for m in misses]
    assert got == EXPECTED
    for lookup in lookups:
        assert sum(got[lookup.request_id]) == lookup.queried_tokens - lookup.hit_tokens
    assert [m.capacity_pages for m in misses] == [0, 0, 0, 0, 0, 1]
    # A's second page was evicted while request 4 ran: one step before the last request.
    assert misses[-1].capacity_age_steps == 1 and misses[-1].capacity_age_s > 0
    total = engine.kv.prefix_misses
    assert (total.cold, total.capacity, total.granularity, total.last_token) == (30, 4, 4, 6)
    assert total.missed == engine.kv.prefix_queried_tokens - engine.kv.prefix_hit_tokens


def test_the_database_gives_the_split_per_request_and_in_total(recorded):
    _, events, db, run_id = recorded
    per_request = request_miss_reasons(db, run_id)
    got = [
        (c.cold, c.capacity, c.granularity, c.last_token) for _, c in sorted(per_request.items())
    ]
    assert got == EXPECTED
    total = run_miss_reasons(db, run_id)
    assert (total.cold, total.capacity, total.granularity, total.last_token) == (30, 4, 4, 6)
    age = next(e for e in events if isinstance(e, PrefixMiss) and e.capacity_pages).capacity_age_s
    assert total.capacity_pages == 1 and total.capacity_age_s == pytest.approx(age)
    assert per_request[0].capacity_age_s is None
    assert miss_line(total).startswith("44 missed tokens: cold 68% · capacity 9% · granularity 9%")


def test_memory_is_bounded_by_the_caps():
    misses = MissReasons(4, max_evicted=3, max_seen_tokens=10, max_children=2)
    pages = [tuple(range(i, i + 4)) for i in range(0, 40, 4)]
    for page in pages[:5]:
        misses.evicted(chain_hash(ROOT_CHAIN, page), 0, 0)
    assert misses.remembered[0] == 3
    # The two oldest evictions are forgotten (their content now counts as cold), the rest not.
    assert misses.classify(iter(pages[:1]), 5, 0, ROOT_CHAIN, None, 0, 0).cold == 4
    assert misses.classify(iter(pages[4:5]), 5, 0, ROOT_CHAIN, None, 0, 0).capacity == 4
    for page in pages:  # ten pages of 4 tokens under one parent and under ten parents
        misses.classify(iter([page]), 5, 0, ROOT_CHAIN, None, 0, 0)
        misses.classify(iter([page]), 5, 0, chain_hash(ROOT_CHAIN, page), None, 0, 0)
        assert misses.remembered[1] <= 10


def test_a_replayed_token_trace_gets_the_same_reasons(tmp_path):
    """The replay drives the same code: the trace above as kvscope JSONL with token ids,
    at unlimited capacity (nothing evicted) and at two pages of cache (A's two pages are
    gone when A comes last)."""
    path = tmp_path / "trace.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt_token_ids": t, "max_tokens": 1}) + "\n" for t in TRACE)
    )
    trace = read_replay_trace(path, "kvscope")
    for capacity, hits, capacity_missed in ((None, 20, 0), (8, 12, 8)):
        driver = ReplayDriver(trace, ReplayConfig(capacity_tokens=capacity, page_size=4))
        result = driver.run()
        misses = result.extra["miss_reasons"]
        assert result.hit_tokens == hits
        assert (misses["capacity"], misses["granularity"], misses["last_token"]) == (
            capacity_missed,
            4,
            6,
        )
        assert misses["cold"] == 30


def test_request_tables_show_each_requests_split(recorded):
    _, _, db, run_id = recorded
    rows = requests_table(db, run_id)
    got = [
        (r.missed_cold, r.missed_capacity, r.missed_granularity, r.missed_last_token) for r in rows
    ]
    assert got == EXPECTED  # the dashboard's requests page and the report's tables
    with connection(db) as conn:
        step, ts_ns = conn.execute(
            "SELECT step, ts_ns FROM steps WHERE run_id = ? AND step = 2", (run_id,)
        ).fetchone()
        states = requests_at(conn, Position(run_id, step, ts_ns), 1e9, None)
    # The TUI at step 2: requests 0..2 admitted (their splits so far), the rest not yet.
    by_id = {s.request_id: s for s in states}
    assert [field_value(by_id[i], "misses.main") for i in range(3)] == [
        "cold",
        "granularity",  # 1 granularity, 1 last token: a tie goes to the first in REASONS
        "cold",
    ]
    assert all(by_id[i].misses is None for i in by_id if i > 2)
    cells = dict(zip((c.key for c in COLUMNS), row_cells(by_id[2]), strict=True))
    assert cells["misses.main"].plain == "cold" and cells["misses.capacity"].plain == "0"


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_capacity_misses_are_what_more_memory_recovers(policy):
    """In a sequential replay cold tokens do not depend on capacity, so at every capacity
    the hits plus the capacity misses are exactly the unlimited ceiling's hits."""
    trace = read_replay_trace(
        Path(__file__).parent / "data" / "mooncake_conversation_head400.jsonl"
    )
    prepared = prepare(trace, 512, belady=True)
    ceiling = ReplayDriver(trace, ReplayConfig(), prepared=prepared).run()
    for capacity in (10**4, 10**5, 10**6):
        config = ReplayConfig(capacity_tokens=capacity, eviction_policy=policy)
        result = ReplayDriver(trace, config, prepared=prepared).run()
        misses = result.extra["miss_reasons"]
        assert misses["capacity"] > 0 or capacity == 10**6  # belady reaches the ceiling there
        assert result.hit_tokens + misses["capacity"] == ceiling.hit_tokens
        assert misses["cold"] == ceiling.extra["miss_reasons"]["cold"]
