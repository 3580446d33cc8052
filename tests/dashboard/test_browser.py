"""The dashboard in a real headless Chromium, against a run that is still being written."""

from __future__ import annotations

import pytest

from kvscope.app.dashboard.layout import PAGES
from kvscope.app.dashboard.screenshots import DEMO_CONFIG, VIEWPORT, wait_for_graphs
from kvscope.app.dashboard.server import Server, create_app
from kvscope.app.watch_demo import record_watch_demo
from kvscope.engine.events import RequestArrived, StepSummary, now_ns
from kvscope.profiler.recorder import Recorder
from kvscope.profiler.synthetic import SyntheticRun, record_synthetic

from support.infllm_recording import record_infllm

pytestmark = pytest.mark.browser

# Graphs per page: every one must draw.
GRAPHS = {
    "overview": 2,
    "kv-cache": 3,
    "prefix-cache": 3,
    "eviction": 2,
    "kernels": 3,
    "gpu": 1,
    "requests": 2,  # the table's figure and the selected request's pages
    "long-context": 2,  # drawn empty, with the run's note, for a run without InfLLM
    "compare": 4,
    "sizing": 1,
    "capacity": 2,
}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A finished run without GPU, then a live one the tests append to by hand
    (the recorder's thread is not started: each ``flush`` is one writer commit)."""
    path = tmp_path_factory.mktemp("live") / "live.db"
    record_synthetic(path, DEMO_CONFIG, num_requests=20, offload=False, seed=5)
    recorder = Recorder(path, DEMO_CONFIG, "synthetic", "synthetic")
    run = SyntheticRun(recorder.start_ns, num_requests=12, num_pages=48, gpu=True, seed=4)
    for event in run.events:
        recorder.on_event(event)
    recorder.flush()
    server = Server(create_app(path, refresh_ms=300), port=0).start()
    yield server, recorder, run
    server.stop()
    recorder.finish()


@pytest.fixture
def page(browser):
    """A fresh tab whose console errors and uncaught exceptions are collected."""
    context = browser.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    tab.errors = []
    tab.on("console", lambda m: m.type == "error" and tab.errors.append(m.text))
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    yield tab
    context.close()


def _open(page, server, path: str) -> int:
    page.goto(server.url.rstrip("/") + path)
    return wait_for_graphs(page)


@pytest.mark.parametrize(("key", "path"), [(key, path) for key, _, path in PAGES if key in GRAPHS])
def test_every_page_loads_and_draws(page, live, key, path):
    server, _, _ = live
    assert _open(page, server, path) == GRAPHS[key]
    assert page.locator(f".nav-link.active#nav-{key}").count() == 1
    if key == "overview":
        assert page.locator(".tile").count() == 8
    if key == "compare":
        assert page.locator("#compare-summary td").filter(has_text="evicted pages").count() == 1
    assert page.errors == []


def test_gpu_page_says_when_a_run_had_no_gpu(page, live):
    server, _, _ = live
    _open(page, server, "/gpu")
    assert page.locator("#gpu-note").inner_text() == ""
    page.locator("#run").click()
    page.get_by_text("#1 synthetic", exact=False).last.click()
    page.wait_for_selector("#gpu-note >> text=No GPU in this run")
    assert page.errors == []


def test_a_row_appended_by_the_writer_appears(page, live):
    server, recorder, run = live
    _open(page, server, "/requests")
    cell = page.locator("#requests-table td[data-dash-column=request_id]")
    assert "4242" not in cell.all_inner_texts()
    recorder.on_event(RequestArrived(now_ns(), run.truth.steps, 4242, 7, 3))
    recorder.flush()
    page.wait_for_selector(
        "#requests-table td[data-dash-column=request_id] >> text=4242", timeout=10_000
    )
    assert page.errors == []


def test_zoom_survives_a_refresh(page, live):
    server, recorder, run = live
    _open(page, server, "/")
    graph = "#overview-throughput .js-plotly-plot"
    box = page.locator(f"{graph} .nsewdrag").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    page.mouse.up()
    zoomed = page.evaluate(f"document.querySelector('{graph}').layout.xaxis.range")
    steps_before = page.locator(".tile-detail").filter(has_text="steps").inner_text()
    step = run.truth.steps + 1
    recorder.on_event(StepSummary(now_ns(), step, 1, 0, 1, 1, 0, 48, 1, 0, 47, 16, 8, 0, 0.001))
    recorder.flush()
    page.wait_for_function(
        "(before) => document.querySelectorAll('.tile-detail')[6].innerText !== before",
        arg=steps_before,
        timeout=10_000,
    )
    wait_for_graphs(page)
    x_range = page.evaluate(f"document.querySelector('{graph}').layout.xaxis.range")
    full = page.evaluate(f"document.querySelector('{graph}').data[1].x.slice(-1)[0]")
    assert full > zoomed[1]  # the new step is in the data, outside the zoomed window
    assert x_range == pytest.approx(zoomed)
    assert page.errors == []


def test_choosing_a_request_shows_its_pages(page, live):
    server, _, _ = live
    _open(page, server, "/requests")
    page.locator("#requests-table input[type=radio]").nth(2).check()
    page.wait_for_selector("#requests-detail .gtitle >> text=Request 2: pages and tokens")
    assert page.errors == []


def test_requests_filter_runs_on_the_server(page, live):
    server, _, _ = live
    _open(page, server, "/requests")
    box = page.locator("th.dash-filter[data-dash-column=request_id] input[type=text]")
    box.fill("< 3")
    box.press("Enter")
    cells = page.locator("#requests-table td[data-dash-column=request_id]")
    page.wait_for_function(
        "() => document.querySelectorAll('#requests-table td[data-dash-column=request_id]').length === 3"
    )
    assert cells.all_inner_texts() == ["0", "1", "2"]
    assert page.errors == []


@pytest.fixture(scope="module")
def watched_and_infllm(tmp_path_factory):
    """A recorded watch of four synthetic vLLM ranks (#1) and a tiny-model InfLLM run (#2)."""
    path = tmp_path_factory.mktemp("watched") / "runs.db"
    watch_id = record_watch_demo(path, requests=60, seconds=1.0)
    infllm_id = record_infllm(path)
    server = Server(create_app(path, refresh_ms=60_000), port=0).start()
    yield server, watch_id, infllm_id
    server.stop()


def _choose_run(page, run_id: int) -> None:
    page.locator("#run").click()
    page.get_by_text(f"#{run_id} ", exact=False).last.click()


def test_watch_page_draws_a_watch_run(page, watched_and_infllm):
    server, watch_id, _ = watched_and_infllm
    page.goto(server.url.rstrip("/") + "/watch")
    _choose_run(page, watch_id)
    page.wait_for_selector("#watch-sources td")
    # Cached blocks by medium, misses, residency from the events, cached tokens by
    # source (empty: no /metrics), duplication, the recorder's back-pressure.
    assert wait_for_graphs(page) == 6
    assert page.locator("#watch-misses td").filter(has_text="fleet").count() == 1
    assert page.locator("#watch-sources tr:has(td)").count() == 4
    assert page.locator("#watch-duplication td").filter(has_text="vllm").count() == 1
    page.locator("#nav-kv-cache").click()
    page.wait_for_selector(f"text=Run #{watch_id} is a watched deployment")
    assert page.errors == []


def test_long_context_page_draws_an_infllm_run(page, watched_and_infllm):
    server, _, infllm_id = watched_and_infllm
    page.goto(server.url.rstrip("/") + "/long-context")
    _choose_run(page, infllm_id)
    # First the request with the most retrieval steps, then the one chosen.
    page.wait_for_selector("#long-context-heatmap .gtitle >> text=InfLLM retrieval, request 0")
    page.locator("#long-context-request").click()
    page.get_by_text("request 1", exact=True).click()
    page.wait_for_selector("#long-context-heatmap .gtitle >> text=InfLLM retrieval, request 1")
    assert wait_for_graphs(page) == 2
    assert page.locator("#long-context-heatmap .heatmaplayer").count() == 1
    assert page.locator("#long-context-note").inner_text() == ""
    assert page.errors == []


def test_sizing_page_follows_its_controls(page, live):
    server, _, _ = live
    _open(page, server, "/sizing")
    assert page.locator("#sizing-tiles .tile").count() == 5
    first = page.locator("#sizing-tiles .tile-value").nth(0).inner_text()
    page.locator("#sizing-device").click()
    page.get_by_text("h200-141", exact=True).click()
    page.wait_for_function(
        "(before) => document.querySelector('#sizing-tiles .tile-value').innerText !== before",
        arg=first,
    )
    assert page.locator(".gtitle").filter(has_text="on h200-141").count() == 1
    assert page.errors == []
