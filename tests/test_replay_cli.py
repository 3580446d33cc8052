"""``kvscope replay``: bad input, recording, interruption, a recorded run as a trace."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kvscope.app.replay.session import RecordSession
from kvscope.engine.replay import ReplayConfig, read_replay_trace
from kvscope.engine.replay.sweep import run_sweep

from support.cli_runs import one_error, run_cli
from support.mooncake_slice import SLICE


def head(tmp_path: Path, n: int, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(SLICE.read_text().splitlines()[:n]) + "\n")
    return path


def test_malformed_line_names_its_number_and_writes_nothing(capsys, tmp_path):
    path = head(tmp_path, 5)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-7]  # cut the JSON short
    path.write_text("\n".join(lines))
    db = tmp_path / "r.db"
    code, _, err = run_cli(capsys, "replay", str(path), "--db", str(db))
    assert code == 2
    one_error(err, f"{path}:3", "not valid JSON")
    assert not db.exists()  # a replay that never started leaves no database behind


@pytest.mark.parametrize(
    ("content", "args", "fragments"),
    [
        ("", (), ("no requests",)),
        ('{"foo": 1}\n', (), ("unknown trace format", ":1")),
        (None, ("--capacity", "0"), ("capacity must be > 0",)),
        (None, ("--capacity", "1e308"), ("is above 1e+15 tokens",)),
        (None, ("--eviction-policy", "lru,mru"), ("unknown eviction policy 'mru'",)),
        (None, ("--format", "nope"), ("invalid choice",)),
        ('{"timestamp": 0, "input_length": -4, "output_length": 1, "hash_ids": [1]}', (),
         ("input_length must be an integer >= 1", ":1")),
        # NaN had hung the replay (that arrival never came), Infinity been a traceback
        ('{"timestamp": NaN, "input_length": 4, "output_length": 1, "hash_ids": [1]}', (),
         ("timestamp must be a finite number >= 0, got nan", ":1")),
        ('{"timestamp": Infinity, "input_length": 4, "output_length": 1, "hash_ids": [1]}',
         (), ("timestamp must be a finite number >= 0, got inf", ":1")),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, content, args, fragments):
    path = head(tmp_path, 5) if content is None else tmp_path / "t.jsonl"
    if content is not None:
        path.write_text(content)
    code, _, err = run_cli(capsys, "replay", str(path), *args, "--db", str(tmp_path / "r.db"))
    assert code == 2
    one_error(err, *fragments)
    assert not (tmp_path / "r.db").exists()


def test_an_arrival_too_far_off_to_bound_a_burst_is_waited_for(capsys, tmp_path):
    """1e300 s away at --speed 1e-300 is no step count (infinity): the decode burst
    before it is bounded by the requests alone (it had been an OverflowError)."""
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 1e300, "input_length": 100, "output_length": 4, "hash_ids": [1, 2]}\n'
        '{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [1, 2]}\n'
    )
    code, out, err = run_cli(
        capsys, "replay", str(path), "--timing", "roofline", "--capacity", "1e5",
        "--speed", "1e-300", "--quiet", "--db", str(tmp_path / "r.db"),
    )  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err


def test_inconsistent_hash_ids_are_counted_and_warned(capsys, tmp_path):
    rows = [json.loads(x) for x in SLICE.read_text().splitlines()[:20]]
    rows[3]["hash_ids"] = rows[3]["hash_ids"][:-2]  # too few
    rows[7]["hash_ids"] = rows[7]["hash_ids"] + [999_999_999]  # too many
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    code, out, err = run_cli(
        capsys, "replay", str(path), "--capacity", "1e5", "--eviction-policy", "lru", "--json"
    )
    assert code == 0
    assert "2 of 20 requests have hash ids inconsistent" in err
    assert "1 too few" in err and "1 too many" in err
    assert json.loads(out)["inconsistent_hash_ids"] == {"too_few": 1, "too_many": 1}
    # --limit counts only the requests it replays (it had warned of the whole file's)
    code, out, err = run_cli(
        capsys, "replay", str(path), "--capacity", "1e5", "--eviction-policy", "lru",
        "--limit", "5", "--json",
    )  # fmt: skip
    assert code == 0
    assert "1 of 5 requests have hash ids inconsistent" in err and "0 too many" in err
    assert json.loads(out)["inconsistent_hash_ids"] == {"too_few": 1, "too_many": 0}


def test_sweep_is_recorded_as_replay_runs_with_the_capacity_keys(capsys, tmp_path):
    db = tmp_path / "r.db"
    code, out, err = run_cli(
        capsys, "replay", str(SLICE), "--limit", "80", "--capacity", "2e5,1e6",
        "--eviction-policy", "lru,belady", "--db", str(db), "--json", "--workers", "2",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert len(report["points"]) == 5  # 2 x 2 + the unlimited ceiling
    conn = sqlite3.connect(db)
    runs = conn.execute("SELECT id, kind, status, config FROM runs").fetchall()
    assert (
        len(runs) == 5
        and {r[1] for r in runs} == {"replay"}
        and {r[2] for r in runs} == {"complete"}
    )
    configs = {r[0]: json.loads(r[3]) for r in runs}
    keys = {
        "capacity_tokens",
        "eviction_policy",
        "page_size",
        "kv_dtype",
        "preset",
        "timing",
        "trace",
        "sweep_id",
    }
    assert all(keys <= set(c) for c in configs.values())
    assert len({c["sweep_id"] for c in configs.values()}) == 1
    # the stored summary's hit/queried tokens come from the events and match the replay's own
    for point in report["points"]:
        run_id = point["run_id"]
        hits = conn.execute(
            "SELECT SUM(json_extract(payload, '$.hit_tokens')), SUM(json_extract(payload, '$.queried_tokens')) "
            "FROM events WHERE run_id = ? AND kind = 'prefix_lookup'",
            (run_id,),
        ).fetchone()
        assert hits == (point["hit_tokens"], point["queried_tokens"])
        metrics = dict(conn.execute("SELECT name, value FROM metrics WHERE run_id = ?", (run_id,)))
        assert metrics["prefix_hit_tokens"] == point["hit_tokens"]
        assert metrics["prefix_queried_tokens"] == point["queried_tokens"]
        assert configs[run_id]["capacity_tokens"] == point["capacity_tokens"]
        assert configs[run_id]["eviction_policy"] == point["policy"]
    steps = conn.execute("SELECT COUNT(*) FROM steps WHERE run_id = ?", (runs[0][0],)).fetchone()[0]
    assert steps >= 80


def test_an_interrupted_replay_is_marked_interrupted(tmp_path):
    trace = read_replay_trace(SLICE).head(60)
    db = tmp_path / "r.db"

    class Stopping(RecordSession):
        def open(self, config):
            bus, close = super().open(config)
            seen = [0]

            def stop(event):
                seen[0] += 1
                if seen[0] == 500:
                    raise KeyboardInterrupt

            bus.subscribe(stop)
            return bus, close

    with pytest.raises(KeyboardInterrupt):
        run_sweep(trace, [ReplayConfig(capacity_tokens=100_000)], 1, Stopping(db, trace, "x"))
    status = sqlite3.connect(db).execute("SELECT status FROM runs").fetchall()
    assert status == [("interrupted",)]


def test_a_recorded_run_replays_with_the_same_sharing(capsys, tmp_path):
    db = tmp_path / "r.db"
    args = (
        "--limit",
        "120",
        "--capacity",
        "1e6",
        "--eviction-policy",
        "lru",
        "--json",
        "--workers",
        "1",
    )
    code, out, _ = run_cli(capsys, "replay", str(SLICE), *args, "--db", str(db))
    assert code == 0
    first = json.loads(out)
    unlimited = [p for p in first["points"] if p["capacity_tokens"] is None][0]
    code, out, err = run_cli(capsys, "replay", str(db), "--run", str(unlimited["run_id"]), *args)
    assert code == 0, err
    again = json.loads(out)
    assert again["format"] == "db" and again["requests"] == 120
    # content ids rebuilt from the page events share exactly what the trace's hash ids shared
    ceiling = [p for p in again["points"] if p["capacity_tokens"] is None][0]
    assert ceiling["hit_tokens"] == unlimited["hit_tokens"]


def test_the_answer_names_the_smallest_capacity_reaching_90_percent(capsys, tmp_path):
    plot = tmp_path / "hit.html"
    args = ("--limit", "100", "--capacity", "1e4,2M,6e6", "--eviction-policy", "lru", "--quiet")
    code, out, err = run_cli(
        capsys, "replay", str(SLICE), *args, "--plot", str(plot), "--workers", "1"
    )
    assert code == 0, err
    assert plot.exists() and "unlimited" in plot.read_text()
    code, js, _ = run_cli(capsys, "replay", str(SLICE), *args, "--json", "--workers", "1")
    report = json.loads(js)
    rates = {p["capacity_tokens"]: p["hit_rate"] for p in report["points"]}
    [answer] = report["answers"]
    target = 0.9 * rates[None]
    smallest = min(c for c, r in rates.items() if c is not None and r >= target)
    assert answer["capacity_tokens"] == smallest
    assert f"{smallest:,} tokens of prefix cache" in out
    # 128 KiB a token for llama3-8b in fp16
    assert answer["capacity_bytes"] == smallest * 131072
