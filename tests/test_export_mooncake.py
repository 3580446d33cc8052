"""``kvscope report --format mooncake``: a recorded tiny-model run with a shared prefix,
exported as a Mooncake trace, has equal hash ids exactly where prompts share full pages,
one line per request with its lengths, and replays to the run's own prefix hits."""

from __future__ import annotations

import json

from kvscope.app.cli import main
from kvscope.db.queries import run_summary
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.events import EventBus
from kvscope.engine.replay.driver import ReplayConfig, ReplayDriver
from kvscope.engine.replay.traces import read_replay_trace
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import tiny_loaded
from kvscope.profiler.recorder import Recorder

SHARED = list(range(1, 13))  # three pages of 4 tokens every prompt starts with
PROMPTS = [SHARED + [20 + 5 * i + j for j in range(5)] for i in range(4)]  # 17 tokens each


def test_a_recorded_run_exports_as_a_mooncake_trace_that_replays_to_its_hits(tmp_path, capsys):
    db = tmp_path / "run.db"
    bus = EventBus()
    engine = Engine(
        EngineConfig(page_size=4, kv_budget_bytes=1 << 20), bus=bus, loaded=tiny_loaded()
    )
    recorder = Recorder(db, {"page_size": 4, "test": "export"}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    for prompt in PROMPTS:  # one after another: the later ones find the shared pages
        engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    recorder.finish("complete")
    live_hits = run_summary(db, recorder.run_id).prefix_hit_tokens
    assert live_hits == 3 * 12

    out = tmp_path / "run.mooncake.jsonl"
    assert main(["report", str(db), "--format", "mooncake", "-o", str(out)]) == 0
    assert "--block-size 4" in capsys.readouterr().err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4
    assert all((r["input_length"], r["output_length"]) == (17, 2) for r in lines)
    assert [r["timestamp"] for r in lines] == sorted(r["timestamp"] for r in lines)
    ids = [r["hash_ids"] for r in lines]
    assert all(len(i) == 5 for i in ids)  # ceil(17 / 4)
    assert all(i[:3] == ids[0][:3] for i in ids)  # the shared prefix: equal ids
    rest = [b for i in ids for b in i[3:]]
    assert len(set(rest)) == len(rest) and not set(rest) & set(ids[0][:3])  # the rest: unique

    trace = read_replay_trace(out, "mooncake", block_size=4)
    assert trace.inconsistent == (0, 0)
    result = ReplayDriver(trace, ReplayConfig(page_size=4)).run()
    assert result.hit_tokens == live_hits and result.queried_tokens == 4 * 17
