"""The TUI on an InfLLM run: the retrieval strip of the selected request, and the
measured memory budget line; neither appears for a run without them."""

from __future__ import annotations

import asyncio

import pytest

from kvscope.app.tui.app import KvscopeApp
from kvscope.app.tui.data import RunReader
from kvscope.app.tui.panels import SHADES, budget_text, gpu_text, infllm_request, infllm_text
from kvscope.db.infllm import retrievals

from support.infllm_recording import record_infllm


@pytest.fixture(scope="module")
def infllm_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("infllm") / "run.db"
    return path, record_infllm(path)


def _view(path, run_id, t_s=None):
    reader = RunReader(path)
    assert reader.ready()
    return reader.view(run_id, t_s)


def test_strip_shows_the_blocks_each_step_attended(infllm_run):
    path, run_id = infllm_run
    view = _view(path, run_id)
    rows = retrievals(path, run_id)
    assert view.retrievals is not None and view.retrievals == [
        r for r in rows if r.step <= view.row.step
    ]
    request = infllm_request(view, None)
    mine = [r for r in view.retrievals if r.request_id == request]
    assert infllm_request(view, 1) == 1  # the selected request, when it has retrievals
    text = infllm_text(view, 200, request).plain.splitlines()
    last = mine[-1]
    assert text[0].startswith(f"request {request}  resident ")
    assert f"{last.blocks_total} distant blocks" in text[0]
    blocks = max(r.blocks_total for r in mine)
    strip = text[1:-1]
    per_row = -(-blocks // len(strip))
    cell = min(3, (200 - 9) // len(mine))
    # The first row (blocks 0..per_row-1) after its 8-character label: a step's
    # cell is a dot exactly when no layer chose a block of the row.
    cells = strip[0][8:]
    for i, r in enumerate(mine):
        chosen = any(r.chosen.get(b, 0) for b in range(per_row))
        assert (cells[i * cell] != "·") == chosen
        assert cells[i * cell] in SHADES + "·"
    assert text[-1] == f"steps {mine[0].step}-{mine[-1].step} →"


def test_budget_line(infllm_run):
    path, run_id = infllm_run
    view = _view(path, run_id)
    b = view.budget
    assert b is not None and b.kv_bytes == 1 << 20  # the configured KV budget
    line = budget_text(b).plain
    assert line.startswith("mem W ") and "KV 1M" in line and "calc " in line
    assert gpu_text(view, 46).plain.splitlines() == ["N/A (no GPU)", line]


def test_the_panel_shows_only_for_an_infllm_run(infllm_run, recorded):
    path, run_id = infllm_run

    async def displayed(db, run) -> bool:
        app = KvscopeApp(db, run_id=run, follow=False)
        async with app.run_test(size=(140, 50)) as pilot:
            while app.view is None or app._loading:
                await pilot.pause(0.05)
            return app.query_one("#infllm").display

    assert asyncio.run(displayed(path, run_id)) is True
    assert asyncio.run(displayed(recorded.path, recorded.run_id)) is False
