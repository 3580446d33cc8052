"""A preempted request's prefix lookup is counted once, at its first admission (vLLM's
rule: ``PrefixCacheStats.record(..., preempted=True)`` keeps re-lookups apart), so an
overloaded roofline replay can never hit more than the unlimited-capacity ceiling."""

from __future__ import annotations

import json
import sqlite3

from kvscope.app.cli import main
from kvscope.db.events import tally
from kvscope.engine.replay import ReplayConfig, ReplayDriver, read_replay_trace

from support.mooncake_slice import SLICE, reference_ceiling

OVERLOAD = ReplayConfig(capacity_tokens=2_000_000, timing="roofline", eviction_policy="lru")


def test_an_overloaded_roofline_replay_stays_under_the_ceiling():
    trace = read_replay_trace(SLICE)
    result = ReplayDriver(trace, OVERLOAD).run()
    assert result.preemptions > 0 and result.rejected == 0  # the overload this is about
    # every request queried its prompt once: re-lookups after preemption are not counted
    assert result.queried_tokens == sum(e.input_len for e in trace.entries)
    ceiling = reference_ceiling(SLICE)
    assert result.hit_rate <= ceiling + 1e-12, (result.hit_rate, ceiling)
    # the re-lookups happened and are kept apart, as vLLM's preempted_queries/hits
    relookups = result.extra["preempted_lookups"]
    assert relookups["queried_tokens"] > 0 and relookups["hit_tokens"] > 0
    # the miss split covers the counted lookups only: it sums to queried - hit
    misses = result.extra["miss_reasons"]
    assert sum(misses[k] for k in ("cold", "capacity", "granularity", "last_token")) == (
        result.queried_tokens - result.hit_tokens
    )


def test_a_recorded_overloaded_replay_stores_the_same_hit_rate(capsys, tmp_path):
    db = tmp_path / "r.db"
    code = main(
        [
            "replay", str(SLICE), "--timing", "roofline", "--capacity", "2e6",
            "--eviction-policy", "lru", "--limit", "250", "--json", "--workers", "1",
            "--db", str(db),
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    [point] = [p for p in json.loads(out)["points"] if p["capacity_tokens"] == 2_000_000]
    assert point["preemptions"] > 0
    conn = sqlite3.connect(db)
    counts = tally(conn, point["run_id"])
    assert (counts.prefix_queried_tokens, counts.prefix_hit_tokens) == (
        point["queried_tokens"],
        point["hit_tokens"],
    )
    metrics = dict(
        conn.execute("SELECT name, value FROM metrics WHERE run_id = ?", (point["run_id"],))
    )
    assert metrics["prefix_hit_tokens"] == point["hit_tokens"]
    assert metrics["prefix_queried_tokens"] == point["queried_tokens"]
    assert point["preempted_lookups"]["queried_tokens"] > 0  # reported apart
