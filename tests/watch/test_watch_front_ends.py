"""The watch views: dashboard figure and table builders, and the TUI renderers and
widget, checked against the query results they draw."""

from __future__ import annotations

import asyncio
import csv
import json
import sqlite3
from collections.abc import Iterator

import pytest
from dash import dcc
from rich.console import Console
from textual.app import App, ComposeResult

from kvscope.app.dashboard import watch_page
from kvscope.app.dashboard.layout import PAGES
from kvscope.app.dashboard.server import create_app
from kvscope.app.report.html import build_html
from kvscope.app.report.tables import write_csv, write_json
from kvscope.app.tui.app import KvscopeApp
from kvscope.app.tui.watch_view import WatchView, render, snapshot
from kvscope.db import watch_read as q
from kvscope.db.source import reader
from kvscope.db.watch_snapshot import watch_snapshot

from support import long_recording
from support.dash_callbacks import call
from support.watch_helpers import B, S


def _text(renderable) -> str:
    console = Console(width=140, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_dashboard_figures_draw_the_query_numbers(recording) -> None:
    path, run_id = recording
    data = watch_snapshot(path, run_id)
    fig = watch_page.cached_blocks_figure(data.cached_series, {0: "zero"})
    traces = {t.name: t for t in fig.data}
    gpu = [p for p in data.cached_series if p.source == 0 and p.medium == "GPU"]
    assert list(traces["zero GPU"].y) == [p.blocks for p in gpu]
    assert list(traces["zero GPU"].x) == [p.t_s for p in gpu]
    assert max(traces["zero CPU"].y) == 1
    dup = watch_page.duplication_figure(data.duplicate_series)
    assert {t.name for t in dup.data} == {"vllm", "sglang"}
    assert max(next(t for t in dup.data if t.name == "vllm").y) == 2


def test_dashboard_tables(recording) -> None:
    path, run_id = recording
    data = watch_snapshot(path, run_id)
    (first, *_) = watch_page.block_rows(data.stats)
    assert (
        first["stored"],
        first["reused (re-announced)"],
        first["recomputed after eviction"],
    ) == (8, 1, 1)
    assert first["cached"] == "GPU: 1"
    (prefix,) = watch_page.prefix_rows(data.prefixes)
    assert prefix["block"] == f"{B & (2**64 - 1):016x}" and prefix["prefix tokens"] == 32
    rows = watch_page.duplication_rows(data.duplication)
    assert [r["peak extra copies"] for r in rows] == [0, 2]
    assert [r["source"] for r in watch_page.source_rows(data.sources)] == [
        "0: tcp://a:1",
        "1: tcp://b:1",
        "2: tcp://c:1",
    ]
    page = watch_page.layout(data)
    assert {"watch-sources", "watch-blocks", "watch-prefixes", "watch-incidents"} <= _ids(page)


def test_empty_run_draws_placeholders() -> None:
    fig = watch_page.cached_blocks_figure([])
    assert fig.layout.annotations[0].text == "no block events recorded yet"


def test_tui_renderers(recording) -> None:
    path, run_id = recording
    text = _text(render(snapshot(path, run_id)))
    assert "vllm: 0 blocks on >= 2 replicas, 0 extra copies (0 tokens), peak 2" in text
    assert "prefix of 2 blocks = 32 tokens: 2 branches, 3 blocks under it, sources 0, 1" in text
    assert "0: tcp://a:1" in text and "GPU:1" in text


def test_incidents_text_marks_losses() -> None:
    incidents = [q.Incident(1.5, 3, "gap", 10, 12, 1, 2, "replay buffer no longer holds them")]
    from kvscope.app.tui.watch_view import incidents_text

    text = incidents_text(incidents)
    assert text.plain.strip() == (
        "1.50s  source 3  gap seq 10-12  recovered 1 lost 2  replay buffer no longer holds them"
    )
    assert any("red" in str(span.style) for span in text.spans)


def test_watch_view_widget_loads_the_run(recording) -> None:
    path, run_id = recording

    class Host(App):
        def compose(self) -> ComposeResult:
            yield WatchView(path, run_id, id="watch")

    async def drive() -> WatchView:
        app = Host()
        async with app.run_test(size=(140, 60)) as pilot:
            view = app.query_one(WatchView)
            for _ in range(400):
                if view.snapshot is not None:
                    break
                await pilot.pause(0.05)
            return view

    view = asyncio.run(drive())
    assert view.snapshot is not None
    assert [s.endpoint for s in view.snapshot.sources] == ["tcp://a:1", "tcp://b:1", "tcp://c:1"]


@pytest.mark.parametrize("follow", [False, True])
def test_tui_app_mounts_the_watch_view_for_a_watch_run(recording, follow: bool) -> None:
    """``kvscope tui DB --run N`` and ``--follow`` (the newest run) on a watch run."""
    path, run_id = recording

    async def drive() -> tuple[bool, bool, list[str], set[str]]:
        app = KvscopeApp(path, run_id if not follow else None, follow=follow)
        async with app.run_test(size=(140, 50)) as pilot:
            for _ in range(400):
                views = app.query(WatchView)
                if views and views.first().snapshot is not None:
                    break
                await pilot.pause(0.05)
            view = app.query_one(WatchView)
            await pilot.pause(0.1)
            footer_actions = {b.binding.action for b in app.active_bindings.values() if b.enabled}
            return (
                app.query_one("#body").display,
                app.query_one("#watch-body").display,
                [s.endpoint for s in view.snapshot.sources],
                footer_actions,
            )

    body, watch, endpoints, actions = asyncio.run(drive())
    assert (body, watch) == (False, True)
    assert endpoints == ["tcp://a:1", "tcp://b:1", "tcp://c:1"]
    # No playback or request keys on a watched deployment; runs, help and quit stay.
    assert not {"toggle_play", "step(1)", "step(-1)", "sort"} & actions
    assert {"switch_run", "help", "quit"} <= actions


def _tree(component) -> Iterator:
    """A component and every component under it, depth first."""
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str):
            yield from _tree(child)


def _ids(component) -> set[str]:
    """The string ids in a component tree (the time graphs' pattern ids left out)."""
    return {c.id for c in _tree(component) if isinstance(getattr(c, "id", None), str)}


def test_dashboard_routes_a_watch_run_to_its_page(recording) -> None:
    path, run_id = recording
    app = create_app(path)
    assert "nav-watch" in _ids(app.layout)
    page, *classes = call(app, "page.children", "/watch", run_id)
    assert {"watch-content", "watch-window"} <= _ids(page)
    assert classes[[key for key, _, _ in PAGES].index("watch")] == "nav-link active"
    content = call(app, "watch-content.children", None, run_id)
    assert {"watch-sources", "watch-blocks", "watch-prefixes"} <= _ids(content)
    # Engine-only pages say they do not apply instead of erroring.
    for path_ in ("/", "/kv-cache", "/long-context"):
        (note, *_) = call(app, "page.children", path_, run_id)
        assert note.children.startswith(f"Run #{run_id} is a watched deployment")


def test_report_on_a_watch_run(recording, tmp_path) -> None:
    path, run_id = recording
    with reader(path) as db:
        page = build_html(db, run_id)
        written = write_csv(db, run_id, tmp_path / "csv")
        document = json.loads(write_json(db, run_id, tmp_path / "r.json").read_text())
    assert "Cached blocks by medium" in page and "Duplicated blocks across replicas" in page
    assert "Largest shared prefixes" in page and "tcp://b:1" in page
    assert {p.stem for p in written} == {
        "watch_sources",
        "watch_blocks",
        "watch_duplication",
        "watch_prefixes",
        "watch_incidents",
        "watch_misses",
    }
    blocks = document["tables"]["watch_blocks"]
    assert (blocks[0]["stored"], blocks[0]["reannounced"], blocks[0]["recomputed"]) == (8, 1, 1)
    with (tmp_path / "csv" / "watch_duplication.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["peak_extra_copies"]) for r in rows] == [0, 2]


def _find(component, component_id: str):
    return next((c for c in _tree(component) if getattr(c, "id", None) == component_id), None)


def _figures(component) -> list:
    return [c.figure for c in _tree(component) if isinstance(c, dcc.Graph)]


POISON = 10**9


def test_dashboard_window_reads_only_its_buckets(tmp_path) -> None:
    """The watch callback with a window shows the window's figures, and reads no
    bucket, scrape or incident outside it: those are poisoned here, and would show."""
    path = tmp_path / "long.db"
    run_id, events = long_recording.build(path)
    end = int(events[-1].t_s) + 1
    lo, hi = end - 900, end  # "last 15 min"
    conn = sqlite3.connect(path)
    for table, columns in (
        (
            "watch_series",
            (
                "stored",
                "removed",
                "recomputed",
                "routing_misses",
                "live",
                "new_blocks",
                "both_misses",
            ),
        ),  # fmt: skip
        ("watch_fleet_series", ("duplicated", "extra_copies")),
    ):
        sets = ", ".join(f"{c} = {c} + {POISON}" for c in columns)
        conn.execute(
            f"UPDATE {table} SET {sets} WHERE bucket * width_s < ? OR (bucket + 1) * width_s > ?",
            (lo, hi),
        )
    conn.execute(
        "INSERT INTO watch_incidents (run_id, ts_ns, source, kind, recovered, lost, detail) "
        "VALUES (?, ?, 0, 'gap', 0, 7, 'outside the window')",
        (run_id, (lo - 5) * S),
    )
    conn.commit()
    conn.close()
    app = create_app(path)
    page = call(app, "watch-content.children", None, run_id, "last 15 min")
    want = long_recording.expected(events, lo, hi)
    prefill = long_recording.expected_prefill(events, lo, hi)
    assert f"t {lo:,}-{hi:,} s" in _find(page, "watch-window-note").children
    blocks = {r["source"]: r for r in _find(page, "watch-blocks").data}
    for src, (stored, removed, recomputed, routing) in want.items():
        row = blocks[src]
        assert (row["stored (window)"], row["removed (window)"]) == (stored, removed)
        assert row["new (prefill) (window)"] == prefill[src][0]
        assert row["recomputed after eviction (window)"] == recomputed
        assert row["routing misses (window)"] == routing
    fleet = next(r for r in _find(page, "watch-misses").data if r["source"] == "fleet")
    recomputed, routing = (sum(w[i] for w in want.values()) for i in (2, 3))
    new, both = (sum(p[i] for p in prefill.values()) for i in (0, 1))
    size = long_recording.BLOCK_SIZE
    assert fleet["recomputed after eviction"] == f"{recomputed:,} ({recomputed * size:,} tokens)"
    assert fleet["routing misses"] == f"{routing:,} ({routing * size:,} tokens)"
    assert fleet["prefill blocks"] == f"{new:,} ({new * size:,} tokens)"
    # the shares are the window's, not the session's (33.3% and 66.7%: whole cycles)
    assert (fleet["recomputed share of prefill"], fleet["routing share of prefill"]) == (
        f"{recomputed / new:.1%}",
        f"{routing / new:.1%}",
    )
    assert fleet["both at once"] == both
    assert fleet["routing-miss tokens/s"] == f"{routing * size / 900:,.1f}"
    assert _find(page, "watch-misses-note").children == "In the window:"
    assert "watch-misses-session" not in _ids(page)
    assert _find(page, "watch-incidents").data == []
    values = [v for fig in _figures(page) for trace in fig.data for v in (trace.y or ()) if v]
    assert values and max(values) < POISON / 3600  # no poisoned bucket, even as a rate
    # The same page over the whole session reads the poisoned buckets: the poison shows.
    whole = call(app, "watch-content.children", None, run_id, "whole session")
    assert max(v for fig in _figures(whole) for t in fig.data for v in (t.y or ()) if v) > 1e5


def test_tui_w_cycles_the_windows(tmp_path) -> None:
    path = tmp_path / "long.db"
    run_id, events = long_recording.build(path)
    end = int(events[-1].t_s) + 1

    class Host(App):
        def compose(self) -> ComposeResult:
            yield WatchView(path, run_id, id="watch")

    async def drive() -> list[tuple[str, list]]:
        shown = []
        app = Host()
        async with app.run_test(size=(140, 60)) as pilot:
            view = app.query_one(WatchView)
            for name, _ in q.WINDOWS:
                for _ in range(400):
                    if view.snapshot is not None and view.snapshot.window_name == name:
                        break
                    await pilot.pause(0.05)
                shown.append((name, view.snapshot))
                await pilot.press("w")
        return shown

    shown = asyncio.run(drive())
    assert [name for name, _ in shown] == [snap.window_name for _, snap in shown]
    for (_, seconds), (name, snap) in zip(q.WINDOWS, shown, strict=True):
        text = _text(render(snap))
        assert f"window: {name}" in text and "[w] next window" in text
        if seconds is None:
            assert snap.window is None and "follow the window" not in text
            continue
        want = long_recording.expected(events, end - seconds, end)
        assert [(s.source, s.stored, s.removed, s.recomputed) for s in snap.stats] == [
            (src, w[0], w[1], w[2]) for src, w in sorted(want.items())
        ]
        # the fleet's shares are the window's prefill's, on the window's line
        new = sum(
            n for n, _ in long_recording.expected_prefill(events, end - seconds, end).values()
        )
        routing = sum(w[3] for w in want.values())
        assert "vllm fleet in the window: recomputed after eviction" in text
        assert (
            f"{routing:,} {routing * 16 / seconds:,.1f} tok/s {routing / new:.1%} of prefill"
            in text
        )
        assert "whole session:" not in text.split("vllm fleet")[-1]  # no session fallback


def _post(app, output: str, inputs: list[dict], changed: str) -> dict:
    """One callback request as the browser sends it, through Flask's test client."""
    client = app.server.test_client()
    body = {"output": output, "outputs": {"id": output.split(".")[0], "property": "data"},
            "inputs": inputs, "state": [], "changedPropIds": [changed]}  # fmt: skip
    response = client.post(
        "/_dash-update-component", data=json.dumps(body), content_type="application/json"
    )
    return response


def test_zooming_a_time_graph_makes_its_range_the_window(tmp_path) -> None:
    path = tmp_path / "long.db"
    run_id, events = long_recording.build(path)
    app = create_app(path)
    graph = {"type": watch_page.ZOOM_GRAPH, "index": "misses"}
    prop = json.dumps(graph, separators=(",", ":"), sort_keys=True) + ".relayoutData"
    relayout = {"xaxis.range[0]": 3700.4, "xaxis.range[1]": 1234.5}  # dragged leftwards
    inputs = [
        [{"id": graph, "property": "relayoutData", "value": relayout}],
        {"id": "watch-window", "property": "value", "value": "whole session"},
    ]
    response = _post(app, "watch-zoom.data", inputs, prop)
    zoom = response.get_json()["response"]["watch-zoom"]["data"]
    assert zoom == {"start_s": 1234.5, "end_s": 3700.4}
    page = call(app, "watch-content.children", None, run_id, "whole session", zoom)
    assert "Window: zoomed (t 1,234-3,700 s)" in _find(page, "watch-window-note").children
    want = long_recording.expected(events, 1234, 3701)
    rows = {r["source"]: r["stored (window)"] for r in _find(page, "watch-blocks").data}
    assert rows == {src: w[0] for src, w in want.items()}
    # Zoomed out (a double-click), or another window chosen: no zoom; a legend click: no change.
    inputs[0][0]["value"] = {"xaxis.autorange": True}
    assert _post(app, "watch-zoom.data", inputs, prop).get_json()["response"] == {
        "watch-zoom": {"data": None}
    }
    inputs[0][0]["value"] = {"hiddenlabels": ["vllm"]}
    response = _post(app, "watch-zoom.data", inputs, prop)
    assert response.get_json()["response"] == {}  # the store keeps its zoom
    inputs[0][0]["value"] = relayout
    response = _post(app, "watch-zoom.data", inputs, "watch-window.value")
    assert response.get_json()["response"] == {"watch-zoom": {"data": None}}


def test_no_none_reaches_a_label_and_shares_plot_in_percent() -> None:
    """A resume's incident is open-ended (it continues after its last recorded batch):
    it had read "seq 1825-None"; vLLM's 0-1 usage share had been plotted as "KV usage
    (blocks)" on an axis of 0-1."""
    from kvscope.app.tui.watch_view import incidents_text

    resumed = q.Incident(1.0, 0, "resumed", 1825, None, 0, 0, "watch started again")
    gap = q.Incident(2.0, 0, "gap", 5, 9, 5, 0, None)
    single = q.Incident(3.0, 0, "bad_message", 7, 7, 0, 0, "x")
    lines = incidents_text([resumed, gap, single]).plain.splitlines()  # newest first
    assert [line.strip().split("  ")[2] for line in lines] == [
        "bad_message seq 7", "gap seq 5-9", "resumed seq after 1825",
    ]  # fmt: skip
    assert [r["seqs"] for r in watch_page.incident_rows([resumed, gap])] == ["5-9", "after 1825"]
    point = q.MetricPoint(0.0, 0.42)
    series = q.EngineSeries(3, "vllm", [point], "blocks", [], [], [], [point], [], [])
    fig = watch_page.engine_metrics_figure(series)
    titles = [a.text for a in fig.layout.annotations]
    assert (
        "KV cache used (% of its blocks)" in titles
        and "prefix hit rate (%, from counters)" in titles
    )
    used, hits = fig.data[0], fig.data[1]
    assert used.y == (42.0,) and hits.y == (42.0,)
    assert tuple(fig.layout.yaxis.range) == (0, 100)
