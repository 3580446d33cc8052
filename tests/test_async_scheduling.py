"""Async scheduling on the CPU: the same tokens, pages and events as the serial engine.

With ``--async-scheduling on`` a step launches the next batch before it reads the
previous one's tokens (engine/async_step.py). On the CPU nothing overlaps, but every
line of the logic runs: fed tokens, pages grown ahead, stops found one step late,
discarded rows. Greedy output must be token-identical to the serial engine across
stop tokens, stop strings, max tokens, shared prefixes, preemption and chunked
prefill; the recording must stay true page by page (tests/page_probe.py); and the
incremental page table must equal a rebuilt one.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from kvscope.engine.async_step import LaunchedStep, feed_for
from kvscope.engine.engine import Engine
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import EventBus
from kvscope.engine.request import Request
from kvscope.engine.sampler import SampledTokens, SamplingParams
from kvscope.engine.scheduler import Scheduler
from kvscope.engine.step_rows import DecodeTable, decode_rows
from kvscope.engine.tiny import BYTES_PER_TOKEN, VOCAB, shared_tiny, tiny_engine

from support.page_probe import (
    PageProbe,
    drive_probed,
    mismatches,
    record_probed,
    shared_prefix_arrivals,
)

COMMON = (10, 12, 14, 23, 60)


def _workload(seed: int, n: int = 14, prefix_len: int = 20) -> list[tuple[int, list[int], dict]]:
    """(arrival step, prompt, sampling kwargs): a shared prefix, varied lengths and stops."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, VOCAB) for _ in range(prefix_len)]
    out = []
    for i in range(n):
        own = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))]
        kw: dict = {"max_tokens": rng.choice([1, 2, 3, 7, 16, 40])}
        # The tiny model's frequent tokens, so the stops fire (the tokenizer has no EOS).
        if i % 3 == 0:
            kw = {"max_tokens": 40, "stop_token_ids": [rng.choice(COMMON)]}  # EOS's code path
        if i % 4 == 1:
            kw = {"max_tokens": 40, "stop": [f"t{rng.choice(COMMON)}"]}
        out.append((rng.randrange(0, 12), (prefix if i % 2 else []) + own, kw))
    return out


def _run(mode: str, arrivals, pages: int = 200, **config):
    """Drive the arrivals to the end; returns (outputs by position, engine, events)."""
    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    engine = tiny_engine(pages, bus=bus, async_scheduling=mode, **config)
    offer = engine.kv.offer

    def offer_known(req: Request) -> None:
        # A block goes into the prefix cache only once its every token is known on the
        # host: never one whose last token is still in flight.
        assert req.num_computed <= req.num_tokens, (req.num_computed, req.num_tokens)
        offer(req)

    engine.kv.offer = offer_known
    pending = sorted(enumerate(arrivals), key=lambda a: a[1][0])
    index: dict[int, int] = {}
    outputs: dict[int, tuple] = {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][0] <= step:
            position, (_, prompt, kw) = pending.pop(0)
            index[engine.add_request(prompt, SamplingParams(**kw))] = position
        for o in engine.step():
            assert o.request_id not in {r for r, p in index.items() if p in outputs}
            if o.finished:
                outputs[index[o.request_id]] = (o.token_ids, o.text, o.finish_reason)
        engine.kv.check_integrity()
        step += 1
        assert step < 5000
    return outputs, engine, events


def _assert_clean_end(engine: Engine, events: list, outputs: dict) -> None:
    """No page leaked, every allocation freed, the events' tokens the outputs' tokens."""
    kv = engine.kv
    assert not kv.holders and not engine.scheduler.running
    cached = kv.prefix.num_cached_only if kv.prefix is not None else 0
    assert kv.pool.num_free + cached == engine.num_pages
    allocated: Counter = Counter()
    freed: Counter = Counter()
    for e in events:
        if e.kind == "pages_allocated":
            allocated.update((e.request_id, p) for p in e.pages)
        elif e.kind == "pages_freed":
            freed.update((e.request_id, p) for p in e.pages)
    assert allocated == freed
    finished = [e for e in events if e.kind == "request_finished"]
    assert sorted(e.output_tokens for e in finished) == sorted(len(o[0]) for o in outputs.values())
    assert len({e.request_id for e in events if e.kind == "first_token"}) == len(outputs)


def test_greedy_tokens_identical_with_stops_limits_and_shared_prefixes():
    arrivals = _workload(0)
    serial, _, serial_events = _run("off", arrivals)
    ahead, engine, events = _run("on", arrivals)
    assert ahead == serial
    reasons = Counter(o[2] for o in serial.values())
    assert reasons["stop"] >= 2 and reasons["length"] >= 2  # both kinds of finish exercised
    assert engine.steps_ahead > 20  # most decode steps ran ahead of their tokens
    assert engine.kv.prefix_hit_tokens > 0  # the shared prefix was matched
    _assert_clean_end(engine, events, ahead)

    # Rows whose request stopped on the token in flight ran for nothing: counted as
    # decoded (their K/V was written), never as emitted tokens; at most one per stopped
    # request (one that reaches its max tokens sits the step out).
    def decoded(events: list) -> int:
        return sum(e.decode_tokens for e in events if e.kind == "step_summary")

    assert 0 < decoded(events) - decoded(serial_events) <= reasons["stop"]


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_and_chunked_prefill_under_a_small_budget(preemption):
    arrivals = [
        (0, p, {"max_tokens": n}) for _, p, n in shared_prefix_arrivals(8, 16, every=0, out=24)
    ]
    arrivals += [(3, [7] * 45, {"max_tokens": 9, "stop": ["t11"]})]
    # No sequence cap: the nine requests queue for pages, not for seats.
    config = {"preemption": preemption, "max_batched_tokens": 16}
    serial, _, _ = _run("off", arrivals, pages=22, **config)
    ahead, engine, events = _run("on", arrivals, pages=22, **config)
    assert ahead == serial
    assert sum(e.kind == "request_preempted" for e in events) > 5
    assert any(e.kind == "chunk_scheduled" for e in events)
    # Admissions and chunks run ahead; only preemptions and swap-ins wait (54 of 69
    # decode steps ahead with recompute, 74 of 90 with swap; 5 before, with recompute).
    assert engine.decode_steps_ahead > 0.7 * engine.decode_steps
    _assert_clean_end(engine, events, ahead)


def test_drawn_rows_fall_back_to_the_serial_path():
    arrivals = [(0, [3, 4, 5] * (i + 1), {"max_tokens": 6, "temperature": 0.9}) for i in range(4)]
    serial, _, _ = _run("off", arrivals)
    ahead, engine, _ = _run("on", arrivals)
    assert ahead == serial  # the same seeds draw the same tokens
    assert engine.steps_ahead == 0  # a drawn token is known on the host only


def test_the_recording_stays_true_at_every_step(tmp_path):
    run_id, probe, kinds = record_probed(
        tmp_path / "r.db",
        lambda bus: tiny_engine(22, bus=bus, async_scheduling="on"),
        shared_prefix_arrivals(8, prefix_len=16, every=1, out=12),
    )
    assert kinds.get("request_preempted", 0) > 0
    assert len(probe.truth) > 10
    wrong = mismatches(tmp_path / "r.db", run_id, probe)
    assert not wrong, f"{len(wrong)} differences, first: {wrong[:5]}"


def test_the_page_probe_agrees_with_the_pool_ahead_of_the_tokens():
    engine = tiny_engine(40, async_scheduling="on")
    probe = PageProbe(engine)
    drive_probed(engine, probe, [(i, [9, 8, 7, 6] * (2 + i), 10 + i) for i in range(6)])
    assert engine.steps_ahead > 5 and len(probe.truth) > 15


def test_incremental_page_table_equals_a_rebuilt_one():
    rng = random.Random(3)
    ps = 4
    reqs = []
    for i in range(9):
        req = Request(i, [1] * rng.randrange(1, 12), SamplingParams(), 0)
        req.num_computed = len(req.prompt_ids) - 1
        req.pages = [rng.randrange(1000) for _ in range(req.num_computed // ps + 1)]
        reqs.append(req)
    kept = DecodeTable()

    def same_as_fresh() -> None:
        got = decode_rows(reqs, ps, True, kept)
        fresh = decode_rows(reqs, ps, True)
        assert np.array_equal(got.flat, fresh.flat) and np.array_equal(got.indptr, fresh.indptr)
        assert got.slots == fresh.slots

    for _ in range(40):
        for req in reqs:  # each decodes one more token; some start a new page
            req.num_computed += 1
            req.output_ids.append(1)
            if req.num_computed // ps == len(req.pages):
                req.pages.append(rng.randrange(1000))
        same_as_fresh()
    assert kept.rebuilds == 1 and kept.updates == 39
    reqs[4].pages = list(reqs[4].pages)  # a page list replaced (swap-in, a prefix match)
    same_as_fresh()
    assert kept.rebuilds == 2
    del reqs[7], reqs[2]  # requests left (finished, preempted): their rows dropped
    for req in reqs[3:]:  # and the others went on, some into a new page
        req.num_computed += 3
        req.output_ids += [1, 1, 1]
        req.pages += [rng.randrange(1000)] * (req.num_computed // ps + 1 - len(req.pages))
    same_as_fresh()
    assert (kept.rebuilds, kept.updates) == (2, 40)
    reqs.append(reqs.pop(0))  # a request the table does not hold where it stands
    same_as_fresh()
    assert kept.rebuilds == 3


def test_the_graph_path_takes_fed_tokens_in_and_out_of_order():
    """CUDA's decode-graph path, run here on the CPU: rows fed in order (one slice copy)
    and, after a request left, out of order (index lists staged in the graph's buffers)."""
    prompts = [[3 + i] * (2 + 3 * i) for i in range(5)]
    params = [SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True) for i in range(5)]

    def run(engine: Engine) -> list[list[int]]:
        ids = [engine.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
        done = {o.request_id: o.token_ids for o in engine.stream() if o.finished}
        return [done[i] for i in ids]

    serial = run(tiny_engine(200, async_scheduling="off", max_num_seqs=8))
    engine = tiny_engine(200, async_scheduling="on", max_num_seqs=8)
    pages_per_seq = -(-engine.max_request_tokens // engine.config.page_size)
    [scratch] = engine.kv.pool.allocate(1)
    engine.runner.capture_decode_graphs(8, pages_per_seq, pad_page=scratch)
    graphs = engine.runner.graphs
    stage, feeds = graphs.stage, []
    graphs.stage = lambda *args: feeds.append(args[-1]) or stage(*args)
    assert run(engine) == serial
    orders = Counter(f.in_order for f in feeds if f is not None)
    assert orders[True] > 5 and orders[False] > 0, orders


def test_steady_decode_updates_the_page_table_instead_of_rebuilding():
    engine = tiny_engine(400, async_scheduling="off")
    for i in range(6):
        engine.add_request([5 + i] * 10, SamplingParams(max_tokens=30, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    table = engine.runner.table
    assert table.updates >= 25 and table.rebuilds <= 3


def test_feed_writes_the_in_flight_tokens_into_their_rows():
    logits = torch.zeros(3, VOCAB)
    logits[[0, 1, 2], [11, 22, 33]] = 1.0
    params = [SamplingParams()] * 3
    reqs = [Request(i, [1], SamplingParams(), 0) for i in range(4)]
    launched = LaunchedStep(reqs[:3], SampledTokens(logits, params, [None] * 3))
    feed = feed_for([reqs[2], reqs[3], reqs[0]], launched)  # one left, one new, reordered
    assert (feed.dst, feed.src, feed.in_order) == ([0, 2], [2, 0], False)
    token_ids = torch.full((3,), -1, dtype=torch.long)
    feed.apply(token_ids)
    assert token_ids.tolist() == [33, -1, 11]
    same = feed_for(reqs[:3], launched)
    assert same.in_order
    token_ids = torch.zeros(3, dtype=torch.long)
    same.apply(token_ids)
    assert token_ids.tolist() == [11, 22, 33]
    assert feed_for([reqs[3]], launched) is None


def test_the_option():
    assert EngineConfig().async_scheduling == "off"  # auto on the CPU: nothing to overlap
    assert EngineConfig(async_scheduling="on").async_scheduling == "on"
    with pytest.raises(KvscopeError, match="async scheduling must be one of auto, on, off"):
        EngineConfig(async_scheduling="yes")
    config = EngineConfig(
        async_scheduling="on", kv_budget_bytes=64 * 4 * BYTES_PER_TOKEN, page_size=4
    )
    assert Engine(config, loaded=shared_tiny()).async_scheduling


def test_the_flag(capsys):
    from kvscope.app.cli import build_parser, main
    from kvscope.app.engine_options import engine_config_from_args

    assert main(["generate", "--async-scheduling", "sometimes", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: error:") and "'auto', 'on', 'off'" in err
    argv = ["run", "--headless", "--device", "cpu", "--async-scheduling", "on"]
    assert engine_config_from_args(build_parser().parse_args(argv)).async_scheduling == "on"
    argv[-1] = "auto"
    assert engine_config_from_args(build_parser().parse_args(argv)).async_scheduling == "off"


@pytest.mark.slow
def test_real_model_async_matches_serial_and_transformers(make_engine, oracle):
    from support.prompts import CHAT, PLAIN

    def run(mode: str, params: list[SamplingParams]) -> tuple[list, Engine]:
        engine = make_engine(async_scheduling=mode)
        ids = [engine.add_request(p, q) for p, q in zip(PLAIN, params[:4], strict=True)]
        ids += [engine.add_request(p, q, chat=True) for p, q in zip(CHAT, params[4:], strict=True)]
        done = {o.request_id: o for o in engine.stream() if o.finished}
        engine.kv.check_integrity()
        assert not engine.kv.holders
        return [(engine.requests[i].prompt_ids, done[i]) for i in ids], engine

    # EOS, a stop string and different max tokens: on and off identical.
    varied = [
        SamplingParams(max_tokens=8 + 5 * i, stop=["\n\n"] if i % 3 else []) for i in range(8)
    ]
    serial, _ = run("off", varied)
    ahead, engine = run("on", varied)
    assert [o for _, o in ahead] == [o for _, o in serial]
    assert engine.steps_ahead > 20
    assert {o.finish_reason for _, o in serial} == {"stop", "length"}
    # 24 tokens each, ignoring EOS: every token transformers' argmax (teacher forcing).
    fixed, _ = run("on", [SamplingParams(max_tokens=24, ignore_eos=True)] * 8)
    for prompt_ids, out in fixed:
        full = torch.tensor([prompt_ids + out.token_ids[:-1]])
        with torch.no_grad():
            expected = oracle(full).logits[0, len(prompt_ids) - 1 :].argmax(-1).tolist()
        assert out.token_ids == expected


def _queue(seed: int, n: int = 40, prefix_len: int = 24) -> list[tuple[int, list[int], dict]]:
    """Arrivals over 30 steps, more than the sequence limit at once: half share a prefix
    (some arrive while its first owner's prefill chunks are in flight), long prompts
    that the small budget chunks, stops of each kind."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, VOCAB) for _ in range(prefix_len)]
    out = [(0, prefix + [3, 1, 4], {"max_tokens": 12})]  # the prefix's first owner
    for i in range(1, n):
        own = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 40))]
        kw: dict = {"max_tokens": rng.choice([1, 4, 9, 20])}
        if i % 5 == 0:
            kw = {"max_tokens": 30, "stop_token_ids": [rng.choice(COMMON)]}
        if i % 7 == 3:
            kw = {"max_tokens": 30, "stop": [f"t{rng.choice(COMMON)}"]}
        at = i if i < 6 else rng.randrange(0, 30)  # the first sharers while the owner prefills
        out.append((at, (prefix if i % 2 else []) + own, kw))
    return out


def test_a_queue_with_arrivals_and_chunks_runs_ahead_and_matches_serial():
    arrivals = _queue(1)
    config = {"max_num_seqs": 8, "max_batched_tokens": 24}
    serial, off, _ = _run("off", arrivals, **config)
    admitted_ahead: list[Request] = []
    schedule_ahead = Scheduler.schedule_ahead

    def recorded(self: Scheduler):
        waiting = list(self.waiting)
        batch = schedule_ahead(self)
        if batch is not None:
            admitted_ahead.extend(r for r in waiting if r in batch.requests)
        return batch

    Scheduler.schedule_ahead = recorded
    try:
        ahead, engine, events = _run("on", arrivals, **config)
    finally:
        Scheduler.schedule_ahead = schedule_ahead
    assert ahead == serial
    # Admitted while a step was in flight, prefix hits among them (their prefix's owner
    # running, its pages written by steps still in flight on a GPU).
    assert len(admitted_ahead) > 20
    assert sum(r.num_cached > 0 for r in admitted_ahead) > 5
    assert off.decode_steps_ahead == 0
    # Admissions and prefill chunks no longer force the serial path: nearly every decode
    # step ran ahead (before: only those with nobody admissible waiting).
    share = engine.decode_steps_ahead / engine.decode_steps
    assert share > 0.9, (engine.decode_steps_ahead, engine.decode_steps)
    assert engine.kv.prefix_hit_tokens > 0
    assert sum(e.kind == "chunk_scheduled" for e in events) > 5
    assert max(e.waiting for e in events if e.kind == "step_summary") > 8  # a real queue
    _assert_clean_end(engine, events, ahead)


def test_a_queue_under_a_small_budget_matches_serial_and_stays_true(tmp_path):
    arrivals = _queue(2, n=24)
    config = {"max_num_seqs": 6, "max_batched_tokens": 16}
    serial, _, _ = _run("off", arrivals, pages=30, **config)
    ahead, engine, events = _run("on", arrivals, pages=30, **config)
    assert ahead == serial
    assert any(e.kind == "request_preempted" for e in events)
    assert engine.decode_steps_ahead > engine.decode_steps // 2
    _assert_clean_end(engine, events, ahead)
    run_id, probe, kinds = record_probed(
        tmp_path / "r.db",
        lambda bus: tiny_engine(30, bus=bus, async_scheduling="on", **config),
        [(at, prompt, kw["max_tokens"]) for at, prompt, kw in arrivals],
    )
    assert kinds.get("request_preempted", 0) > 0 and kinds.get("chunk_scheduled", 0) > 0
    wrong = mismatches(tmp_path / "r.db", run_id, probe)
    assert not wrong, f"{len(wrong)} differences, first: {wrong[:5]}"
