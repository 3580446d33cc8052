"""The queries the dashboard pages use (db/) against a recorded run whose true counts are known."""

from __future__ import annotations

import dataclasses

import pytest

from kvscope.app.dashboard import table_filter
from kvscope.db import queries
from kvscope.db.queries import RequestRow, requests_table, run_info, step_series
from kvscope.db.store import open_db
from kvscope.db.writer import Writer
from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import PagesAllocated, PagesFreed, RequestArrived, RequestFinished
from kvscope.engine.presets import device_preset
from kvscope.profiler.recorder import to_batch


def test_cached_sources_split_hits_and_reloads(synthetic_db):
    path, run_id, run = synthetic_db
    with queries.reader(path) as db:
        points = step_series(db, run_id, 40)
        sources = queries.cached_sources(db, run_id, points)
    assert sum(sources.device_tokens) == run.truth.prefix_hit_tokens
    assert sum(sources.host_tokens) == run.truth.reloaded_pages * run.page_size
    assert sources.t_s == [p.t_s for p in points]


def test_event_counts_sum_to_the_true_counts(synthetic_db):
    path, run_id, run = synthetic_db
    with queries.reader(path) as db:
        counts = queries.event_counts(db, run_id, max_points=25)
    assert len(counts.t_s) <= 25
    assert sum(counts.counts["page_evicted"]) == run.truth.evicted_pages
    assert sum(counts.counts["page_offloaded"]) == run.truth.offloaded_pages
    assert sum(counts.counts["page_reloaded"]) == run.truth.reloaded_pages
    assert sum(counts.counts["request_preempted"]) == run.truth.preemptions
    assert all(0 < t < counts.bucket_s * 26 for t in counts.t_s)


def test_transfer_costs_measured_and_predicted(synthetic_db):
    path, run_id, run = synthetic_db
    with queries.reader(path) as db:
        costs = {c.action: c for c in queries.transfer_costs(db, run_info(db, run_id))}
    # The synthetic engine charges 2e-5 s per offload, 3e-5 s per reload and
    # 2 ms + 20 us per token per step, so the fitted prefill cost is 20 us/token.
    assert costs["offload"].samples == run.truth.offloaded_pages
    assert costs["offload"].measured_s == pytest.approx(2e-5)
    assert costs["reload"].measured_s == pytest.approx(3e-5)
    assert costs["recompute"].measured_s == pytest.approx(20e-6 * run.page_size, rel=1e-6)
    cpu = device_preset("cpu")
    assert costs["reload"].predicted_s == pytest.approx(
        run.page_size * 46080 / (cpu.pcie_gbps * 1e9)
    )
    assert costs["recompute"].predicted_s == pytest.approx(
        run.page_size * 2 * 134_515_008 / (cpu.fp16_tflops * 1e12)
    )


def test_device_peaks_prefer_the_measured_gpu(synthetic_db):
    path, run_id, _ = synthetic_db
    with queries.reader(path) as db:
        info = run_info(db, run_id)
    preset = queries.device_peaks(info)
    assert (preset.tflops, preset.gbps) == (0.85, 25)
    hardware = {"peak_tflops": 989.0, "peak_gbps": 3350.0, "gpus": [{"name": "H100"}]}
    gpu = queries.device_peaks(dataclasses.replace(info, hardware=hardware))
    assert (gpu.tflops, gpu.gbps, gpu.source) == (989.0, 3350.0, "H100")
    # Runs recorded before ``cost_device`` named the preset ``device``.
    legacy = dataclasses.replace(info, config={"device": "h100-80"})
    assert queries.device_peaks(legacy).source == "preset h100-80"
    assert queries.device_peaks(dataclasses.replace(info, config={})).tflops is None


def test_a_cpu_run_reads_against_the_cpu_preset_in_the_tui_and_the_dashboard(synthetic_db):
    """One answer for %peak: the kernel stats (dashboard table, TUI panel) and the
    roofline (dashboard) use the same peaks; the TUI caption names them."""
    from kvscope.app.tui.data import RunReader
    from kvscope.app.tui.panels import kernels_table

    path, run_id, _ = synthetic_db
    with queries.reader(path) as db:
        info = run_info(db, run_id)
        stats = queries.kernel_stats(db, run_id)
    peaks = queries.device_peaks(info)
    if not info.hardware.get("peak_tflops"):  # recorded without a GPU: the cost preset
        assert peaks.source == "preset cpu"
    for k in stats:
        assert k.peak_tflops_frac == pytest.approx(k.tflops / peaks.tflops)
        assert k.peak_gbps_frac == pytest.approx(k.gbps / peaks.gbps)
    reader = RunReader(path)
    assert reader.ready()
    view = reader.view(run_id, None)
    reader.close()
    assert view.kernels == stats
    assert f"({peaks.source})" in kernels_table(view).caption


def test_request_trace_follows_the_request_events(synthetic_db):
    path, run_id, run = synthetic_db
    preempted = next(e.request_id for e in run.events if e.kind == "request_preempted")
    held, expected = 0, []
    for e in run.events:
        if isinstance(e, PagesAllocated | PagesFreed) and e.request_id == preempted:
            held += len(e.pages) if isinstance(e, PagesAllocated) else -len(e.pages)
            expected.append(held)
    finished = next(
        e for e in run.events if isinstance(e, RequestFinished) and e.request_id == preempted
    )
    with queries.reader(path) as db:
        trace = queries.request_trace(db, run_id, preempted)
    assert trace.pages == expected and expected[-1] == 0
    assert trace.tokens[-1] == finished.prompt_tokens + finished.output_tokens
    assert 0 in trace.tokens[1:-1]  # dropped to nothing when preempted (recompute)
    kinds = [kind for _, kind in trace.marks]
    assert kinds[0] == "request_arrived" and kinds[-1] == "request_finished"
    assert "request_preempted" in kinds and "request_resumed" in kinds
    assert trace.pages_t_s == sorted(trace.pages_t_s)


def test_request_trace_of_an_unknown_request(synthetic_db):
    path, run_id, _ = synthetic_db
    with queries.reader(path) as db, pytest.raises(KvscopeError, match="no request 9999"):
        queries.request_trace(db, run_id, 9999)


def _row(rid: int, status: str, ttft: float | None) -> RequestRow:
    return RequestRow(rid, status, 0.0, 0.0, ttft, None, None, 10, 2, 0, 0, None, None)


def test_request_records_filter_and_sort():
    rows = [_row(0, "finished", 0.3), _row(1, "running", 0.1), _row(2, "waiting", None)]

    def ids(query: str, sort_by: list | None = None) -> list[int]:
        return [r.request_id for r in table_filter.filter_requests(rows, query, sort_by or [])]

    assert ids("{status} scontains fin") == [0]
    assert ids("{status} icontains RUN") == [1]
    assert ids("{status} scontains RUN") == []
    assert ids("{ttft_s} > 0.2") == [0]
    assert ids("{ttft_s} s< 0.2") == [1]
    assert ids("{request_id} = 2") == [2]
    assert ids('{status} = "running" && {ttft_s} < 1') == [1]
    assert ids("{nonsense} > 1") == [0, 1, 2]
    assert ids("", [{"column_id": "ttft_s", "direction": "desc"}]) == [0, 1, 2]  # None last
    assert ids("", [{"column_id": "ttft_s", "direction": "asc"}]) == [1, 0, 2]
    assert table_filter.request_record(rows[1])["id"] == 1  # the row id DataTable selects by


def test_version_changes_when_a_writer_appends(synthetic_db, tmp_path):
    path = tmp_path / "copy.db"
    with queries.reader(synthetic_db[0]) as source:
        source.conn.execute("VACUUM INTO ?", (str(path),))
    run_id = synthetic_db[1]
    with queries.reader(path) as db:
        before = queries.fingerprint(db, run_id)
        assert queries.fingerprint(db, run_id) == before
        assert queries.fingerprint(db, None) == {"runs": 1, "newest": run_id, "run": None}
    db = open_db(path)
    Writer(db, run_id).write(to_batch([RequestArrived(0, 0, 777, 5, 5)]))
    db.conn.close()
    with queries.reader(path) as db:
        assert queries.fingerprint(db, run_id) != before
        assert any(r.request_id == 777 for r in requests_table(db, run_id))


def test_choose_run(synthetic_db, tmp_path):
    path, run_id, _ = synthetic_db
    with queries.reader(path) as db:
        assert queries.choose_run(db, None) == run_id
        assert queries.choose_run(db, run_id) == run_id
        with pytest.raises(KvscopeError, match="no run 42"):
            queries.choose_run(db, 42)
    open_db(tmp_path / "empty.db").conn.close()
    with queries.reader(tmp_path / "empty.db") as db, pytest.raises(KvscopeError, match="no runs"):
        queries.choose_run(db, None)
    with pytest.raises(KvscopeError, match="no database at"):
        with queries.reader(tmp_path / "missing.db"):
            pass


def test_raw_rows_stream_every_row(synthetic_db):
    path, run_id, run = synthetic_db
    with queries.reader(path) as db:
        columns, rows = queries.raw_rows(db, run_id, "kernels")
        rows = list(rows)
    assert columns[:3] == ["t_s", "step", "name"]
    assert len(rows) == sum(run.truth.kernel_calls.values())
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
