"""Each panel shows the figures the database holds at the shown step.

Expected figures come straight from SQL on the recorded tables (or from the
synthetic run's own counts), not from the TUI's data layer.
"""

from __future__ import annotations

import re
import sqlite3

import numpy as np
import pytest

from kvscope.app.tui import fmt
from kvscope.app.tui.page_grid import PageGrid
from kvscope.app.tui.panels import LABEL_WIDTH, VALUE_WIDTH, Panel
from kvscope.app.tui.requests_table import RequestsTable

from support.tui_helpers import Recorded, aio, goto_step, rich_text, viewer, wait_for_view

# A step in the middle of the checked run: requests running, pages cached,
# evictions and a preemption behind it.
STEP = 60


def value(app, panel_id: str, label: str) -> str:
    """The value a panel shows on the row labelled ``label``."""
    text = app.query_one(f"#{panel_id}", Panel).render().plain
    for line in text.splitlines():
        if line[:LABEL_WIDTH].strip() == label:
            return line[LABEL_WIDTH : LABEL_WIDTH + VALUE_WIDTH].strip()
    raise AssertionError(f"no row {label!r} in panel {panel_id}:\n{text}")


@pytest.fixture(scope="module")
def db(recorded: Recorded) -> sqlite3.Connection:
    conn = sqlite3.connect(recorded.path)
    yield conn
    conn.close()


def step_row(db: sqlite3.Connection, run_id: int, step: int) -> sqlite3.Row:
    db.row_factory = sqlite3.Row
    row = db.execute(
        """SELECT s.*, (s.ts_ns - r.start_ns) / 1e9 AS t_s FROM steps s JOIN runs r ON r.id = s.run_id
           WHERE s.run_id = ? AND s.step = ?""",
        (run_id, step),
    ).fetchone()
    db.row_factory = None
    return row


@aio
async def test_every_panel_shows_the_databases_figures(
    recorded: Recorded, db: sqlite3.Connection
) -> None:
    run_id = recorded.run_id
    app = viewer(recorded)
    async with app.run_test(size=(160, 50)) as pilot:
        view = await goto_step(pilot, app, STEP)
        s = step_row(db, run_id, STEP)
        slots = s["pages_used"] * s["page_size"]

        # Fragmentation: page-level vs token-level usage of this step's summary.
        assert value(app, "fragmentation", "page usage") == fmt.pct(
            s["pages_used"] / s["pages_total"]
        )
        assert value(app, "fragmentation", "token usage") == fmt.pct(s["tokens_held"] / slots)
        assert value(app, "fragmentation", "empty slots") == fmt.count(slots - s["tokens_held"])

        # Prefix cache: hit tokens / queried tokens of every first lookup up to the step (a
        # preempted request's re-lookup is left out, vLLM's rule).
        queried, hit = db.execute(
            """SELECT SUM(json_extract(payload, '$.queried_tokens')), SUM(json_extract(payload, '$.hit_tokens'))
               FROM events WHERE run_id = ? AND kind = 'prefix_lookup' AND step <= ?
               AND NOT COALESCE(json_extract(payload, '$.preempted'), 0)""",
            (run_id, STEP),
        ).fetchone()
        assert 0 < hit < queried
        assert value(app, "prefix", "hit overall") == fmt.pct(hit / queried)
        assert value(app, "prefix", "cached") == f"{s['pages_cached']} pg"
        assert value(app, "prefix", "cached tok") == fmt.count(s["pages_cached"] * s["page_size"])

        # Eviction / offload / preemption: event counts up to the step.
        counts = dict(
            db.execute(
                "SELECT kind, COUNT(*) FROM events WHERE run_id = ? AND step <= ? GROUP BY kind",
                (run_id, STEP),
            ).fetchall()
        )
        for label, kind in (
            ("evicted", "page_evicted"),
            ("offloaded", "page_offloaded"),
            ("reloaded", "page_reloaded"),
            ("preempted", "request_preempted"),
        ):
            assert counts.get(kind, 0) > 0, kind
            assert value(app, "churn", label) == fmt.count(counts[kind])
        assert value(app, "churn", "host tier") == f"{s['host_pages_used']} pg"

        # Throughput: decode tokens over the run so far, and the scheduler's queue.
        decode, first_ts, first_duration = db.execute(
            "SELECT SUM(decode_tokens), MIN(ts_ns), (SELECT duration_s FROM steps WHERE run_id = ? AND step = 0)"
            " FROM steps WHERE run_id = ? AND step <= ?",
            (run_id, run_id, STEP),
        ).fetchone()
        assert value(app, "throughput", "overall") == fmt.rate(decode / s["t_s"], " t/s")
        span = (s["ts_ns"] - first_ts) / 1e9 + first_duration  # the window covers the whole run
        assert value(app, "throughput", "decode") == fmt.rate(decode / span, " t/s")
        assert value(app, "throughput", "running") == str(s["running"])
        assert value(app, "throughput", "waiting") == str(s["waiting"])

        # GPU: the recorded NVML sample.
        assert value(app, "gpu", "utilization") == "50.0%"
        assert value(app, "gpu", "memory") == "2.0 GiB"
        assert value(app, "gpu", "total") == "80.0 GiB"
        assert value(app, "gpu", "power") == "300 W"

        # Kernels: calls, mean time and share of the (fixed) device peak up to the step.
        kernels = app.query_one("#kernels", Panel).render()
        table_text = rich_text(kernels, app.query_one("#kernels").size.width)
        for name, calls, seconds, flops, nbytes in db.execute(
            "SELECT name, COUNT(*), SUM(seconds), SUM(flops), SUM(bytes) FROM kernels"
            " WHERE run_id = ? AND step <= ? GROUP BY name",
            (run_id, STEP),
        ):
            peak = max(flops / seconds / 1e12 / 0.5, nbytes / seconds / 1e9 / 20.0)
            row = next(line for line in table_text.splitlines() if name in line).split()
            assert row[1:] == [
                str(calls),
                *fmt.seconds(seconds / calls).split(),
                fmt.number(flops / seconds / 1e12, 3),
                fmt.number(nbytes / seconds / 1e9, 1),
                fmt.pct(peak),
            ]

        # Requests: one row per arrived request; pages they hold add up to the step's pages_used.
        table = app.query_one(RequestsTable)
        arrived = db.execute(
            "SELECT COUNT(*) FROM requests WHERE run_id = ? AND arrival_ns <= ?",
            (run_id, s["ts_ns"]),
        ).fetchone()[0]
        assert table.row_count == arrived == len(view.requests)
        pages = [int(table.get_row(key)[5].plain) for key in table.rows]
        assert sum(pages) == s["pages_used"] > 0
        states = [table.get_row(key)[1].plain for key in table.rows]
        assert states.count("running") == s["running"]
        for rid, prompt, output, ttft in db.execute(
            "SELECT request_id, prompt_tokens, output_tokens, ttft_s FROM requests"
            " WHERE run_id = ? AND finished_ns <= ?",
            (run_id, s["ts_ns"]),
        ):
            cells = [cell.plain for cell in table.get_row(str(rid))]
            assert cells[1:4] == ["finished", str(prompt), str(output)]
            assert cells[6] == fmt.seconds(ttft).replace(" ", "")  # the table's narrow form

        # Page map: one cell per page, owners as the engine's snapshot holds them.
        page_map = app.query_one(PageGrid)
        assert page_map.owners is not None and len(page_map.owners) == s["pages_total"]
        assert int(np.count_nonzero(page_map.owners >= 0)) == s["pages_used"]
        assert len(re.findall("▆+", page_map.render().plain)) == s["pages_total"]


@aio
async def test_page_map_shows_the_stored_snapshot_at_a_snapshot_step(
    recorded: Recorded, db: sqlite3.Connection
) -> None:
    from kvscope.db.queries import decode_owners

    step, blob = db.execute(
        "SELECT step, owners FROM page_maps WHERE run_id = ? AND step >= ? ORDER BY step LIMIT 1",
        (recorded.run_id, STEP),
    ).fetchone()
    stored = decode_owners(blob)
    app = viewer(recorded)
    async with app.run_test(size=(120, 40)) as pilot:
        await goto_step(pilot, app, step)
        shown = app.query_one(PageGrid).owners
        evicted = stored == -3
        assert np.array_equal(shown[~evicted], stored[~evicted])
        assert np.isin(shown[evicted], [-3, -4]).all()


@aio
async def test_gpu_panel_says_na_without_gpu_samples(recorded: Recorded) -> None:
    app = viewer(recorded, run_id=recorded.small_id)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_view(pilot, app)
        assert app.query_one("#gpu", Panel).render().plain == "N/A (no GPU)"
