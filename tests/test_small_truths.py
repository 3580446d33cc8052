"""Smaller truths of issue 21: a fixed --kv-budget is not compared with calc, compare
starts from the selected run with rounded config values, a request's tokens held
start when it is scheduled."""

from __future__ import annotations

from kvscope.app.dashboard.figures import budget_tiles
from kvscope.app.report.html import build_html
from kvscope.app.tui.panels import budget_text
from kvscope.db.memory_budget import budget_title, measured_budget
from kvscope.db.source import reader
from kvscope.engine.events import EventBus
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.tiny import tiny_engine
from kvscope.profiler.recorder import Recorder


def _record(path, config: dict) -> int:
    bus = EventBus()
    engine = tiny_engine(32, bus=bus)
    recorder = Recorder(path, config, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=4))
    recorder.finish("complete")
    return recorder.run_id


def test_a_fixed_kv_budget_is_not_compared_with_calc(tmp_path):
    fixed = {"kv_budget_bytes": 32 * 4 * 256}
    run_id = _record(tmp_path / "fixed.db", fixed)
    budget = measured_budget(tmp_path / "fixed.db", run_id)
    assert budget is not None
    title = budget_title(budget, fixed)
    assert "fixed at" in title and "--kv-budget" in title and "90%" not in title
    assert [t.label for t in budget_tiles(budget, fixed)][-1] == "KV cache"
    assert "KV fixed by --kv-budget" in budget_text(budget, fixed).plain
    with reader(tmp_path / "fixed.db") as db:
        page = build_html(db, run_id)
    assert "KV cache fixed at" in page and "measured / predicted" not in page
    # A budget kvscope run grew to fit the workload is named so, not as --kv-budget's
    # (every run of make run had said "fixed at 25 MiB by --kv-budget", given no flag).
    grown = fixed | {"kv_budget_source": "grown", "kv_budget_fit_requests": 2}
    title = budget_title(budget, grown)
    assert "grown to fit 2 of the workload's longest requests" in title
    assert "--kv-budget (" not in title and "by --kv-budget" not in title
    assert "KV grown to fit" in budget_text(budget, grown).plain
    default = fixed | {"kv_budget_source": "default"}
    assert "kvscope run's default" in budget_title(budget, default)
    sized = {"kv_budget_bytes": None, "memory_fraction": 0.9}
    assert "(90% of" in budget_title(budget, sized)
    assert "measured / predicted" in budget_tiles(budget, sized)[-1].detail


def test_an_interrupted_runs_summary_counts_unfinished_requests_tokens(tmp_path):
    bus = EventBus()
    engine = tiny_engine(64, bus=bus)
    recorder = Recorder(tmp_path / "r.db", {}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    for n in (6, 40, 40):
        engine.add_request(list(range(1, 9)), SamplingParams(max_tokens=n, ignore_eos=True))
    while not any(r.is_finished for r in engine.requests.values()):
        engine.step()
    for _ in range(5):  # the others keep decoding, then Ctrl-C
        engine.step()
    summary = recorder.finish("interrupted")
    unfinished = [r for r in engine.requests.values() if not r.is_finished]
    assert unfinished and all(r.output_ids for r in unfinished)
    assert summary.output_tokens == engine.total_output_tokens
    assert summary.requests_finished == 1


def test_tokens_held_is_flat_until_the_request_is_scheduled(tmp_path):
    from kvscope.db.requests import request_times, request_trace

    bus = EventBus()
    engine = tiny_engine(64, bus=bus, max_num_seqs=1)  # the second request waits
    recorder = Recorder(tmp_path / "r.db", {}, model="tiny")
    bus.subscribe(recorder.on_event)
    recorder.start()
    engine.generate([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], SamplingParams(max_tokens=8))
    recorder.finish("complete")
    times = {t.request_id: t for t in request_times(tmp_path / "r.db", recorder.run_id)}
    waited = max(times.values(), key=lambda t: t.scheduled_ns - t.arrival_ns)
    assert waited.scheduled_ns > waited.arrival_ns
    trace = request_trace(tmp_path / "r.db", recorder.run_id, waited.request_id)
    scheduled_s = (waited.scheduled_ns - waited.arrival_ns) / 1e9 + trace.tokens_t_s[0]
    before = [
        n for t, n in zip(trace.tokens_t_s, trace.tokens, strict=True) if t < scheduled_s - 1e-9
    ]
    assert before and all(n == 0 for n in before)
    # at the scheduling time the line steps: the count before, then after
    at = [
        n
        for t, n in zip(trace.tokens_t_s, trace.tokens, strict=True)
        if abs(t - scheduled_s) < 1e-6
    ]
    assert at[:1] == [0]


def test_compare_starts_from_the_selected_run_with_rounded_config(tmp_path):
    from kvscope.app.dashboard.server import create_app

    from support.dash_callbacks import call

    path = tmp_path / "r.db"
    ids = [_record(path, {"rate": rate}) for rate in (0.1 + 0.2, 2.0, 3.0)]
    app = create_app(path)
    _, value = call(app, "compare-runs.value", None, None, ids[0], trigger="version.data")
    assert value[0] == ids[0] and len(value) == 2 and ids[0] not in value[1:]
    out = call(app, "compare-config.data", [ids[0], ids[1]], None, trigger="compare-runs.value")
    rate = next(row for row in out[2] if row["metric"] == "rate")
    assert rate[f"#{ids[0]}"] == "0.3" and rate[f"#{ids[1]}"] == "2"


def test_the_dashboard_url_of_an_ipv6_host_has_brackets(tmp_path):
    """``dash --host ::1`` had printed http://::1:8050/, which no browser opens."""
    import urllib.request

    from kvscope.app.dashboard.server import Server, create_app
    from kvscope.db.store import open_db

    open_db(tmp_path / "k.db").conn.close()
    server = Server(create_app(tmp_path / "k.db"), host="::1", port=0).start()
    try:
        assert server.url == f"http://[::1]:{server.port}/"
        with urllib.request.urlopen(server.url, timeout=30) as response:
            assert response.status == 200
    finally:
        server.stop()
