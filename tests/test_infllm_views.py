"""InfLLM's recorded retrievals read back from SQLite and drawn: heatmap cells and byte lines."""

from __future__ import annotations

import pytest

from kvscope.app.dashboard.infllm_figures import MIB, block_heatmap, resident_bytes_figure
from kvscope.db.infllm import retrievals
from kvscope.engine.events import InfLLMRetrieval

from support.infllm_recording import record_infllm


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    db = tmp_path_factory.mktemp("infllm") / "run.db"
    emitted: list[InfLLMRetrieval] = []
    run_id = record_infllm(
        db, also=lambda e: emitted.append(e) if isinstance(e, InfLLMRetrieval) else None
    )
    return db, run_id, emitted


def test_retrievals_read_back(recorded):
    db, run_id, emitted = recorded
    rows = retrievals(db, run_id)
    assert len(rows) == len(emitted)
    assert {r.request_id for r in rows} == {0, 1}
    for row, event in zip(rows, sorted(emitted, key=lambda e: (e.step, e.ts_ns)), strict=True):
        assert row.chosen == dict(zip(event.chosen_blocks, event.chosen_layers, strict=True))
        assert row.resident_bytes == event.resident_bytes
    assert retrievals(db, run_id, request_id=1) == [r for r in rows if r.request_id == 1]


def test_block_heatmap_cells_count_layers(recorded):
    db, run_id, _ = recorded
    rows = retrievals(db, run_id, request_id=0)
    heat = block_heatmap(rows, 0).data[0]
    z = heat.z
    assert list(heat.x) == [r.step for r in rows]
    assert len(z) == max(r.blocks_total for r in rows)
    for col, r in enumerate(rows):
        assert sum(z[b][col] for b in range(len(z))) == sum(r.chosen.values())
        # 2 layers x min(3, blocks) choices per step
        assert sum(r.chosen.values()) == 2 * min(3, r.blocks_total)


def test_empty_views_say_so():
    assert block_heatmap([], 5).layout.annotations[0].text.startswith("no InfLLM")
    assert resident_bytes_figure([]).layout.annotations[0].text.startswith("no InfLLM")


def test_resident_lines_in_mib(recorded):
    db, run_id, _ = recorded
    rows = retrievals(db, run_id)
    fig = resident_bytes_figure(rows)
    assert [t.name for t in fig.data] == [
        "req 0 resident",
        "req 0 offloaded",
        "req 1 resident",
        "req 1 offloaded",
    ]
    first = [r for r in rows if r.request_id == 0]
    assert list(fig.data[0].y) == [r.resident_bytes / MIB for r in first]
    assert fig.data[1].y[-1] == first[-1].offloaded_bytes / MIB > 0
