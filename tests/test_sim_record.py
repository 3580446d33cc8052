"""``kvscope simulate --db`` records each allocator as a 'simulation' run the front ends can read."""

from __future__ import annotations

import json

from kvscope.app.cli import main
from kvscope.db import queries


def test_simulation_runs_in_database(tmp_path, capsys):
    db = tmp_path / "sim.db"
    assert main(["simulate", "--requests", "40", "--db", str(db), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    runs = {r.config["allocator"]: r for r in queries.list_runs(db)}
    assert set(runs) == {"max_reservation", "doubling", "paged"}
    assert all(r.kind == "simulation" and r.status == "complete" for r in runs.values())
    for name, run in runs.items():
        points = queries.step_series(db, run.run_id, max_points=100_000)
        assert len(points) == summary[name]["steps"]
        assert max(p.running for p in points) == summary[name]["max_batch"]
        # token usage is held / reserved per step; weighted by what was reserved it is
        # the simulator's utilization (mean held / mean reserved)
        held = sum(p.token_usage * p.pages_used for p in points if p.token_usage is not None)
        reserved = sum(p.pages_used for p in points if p.token_usage is not None)
        assert abs(held / reserved - summary[name]["utilization"]) < 0.01


def test_simulation_figures_agree_with_what_simulate_printed(tmp_path, capsys):
    from kvscope.app.tui.data import RunReader

    db = tmp_path / "sim.db"
    args = ["simulate", "--requests", "60", "--budget-tokens", "6000", "--db", str(db), "--json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["paged"]["preemptions"] > 0 or printed["doubling"]["preemptions"] > 0
    assert main(["runs", str(db)]) == 0
    listing = capsys.readouterr().out
    for run in queries.list_runs(db):
        name = run.config["allocator"]
        assert f"{name} allocator" in listing and run.subject == f"{name} allocator"
        assert run.requests == printed[name]["requests"] == 60
        summary = queries.run_summary(db, run.run_id)
        assert summary.requests == summary.requests_finished == 60
        assert summary.preemptions == printed[name]["preemptions"]
        with queries.reader(db) as conn:
            (decoded,) = conn.execute(
                "SELECT SUM(running) FROM steps WHERE run_id = ?", (run.run_id,)
            ).fetchone()
        # one token per running request per step: the throughput plot's line
        assert summary.output_tokens == decoded > 0 and summary.tokens_per_s > 0
        # the last step shows the allocator's last layout, pages held as its summary says
        reader = RunReader(db)
        assert reader.ready()
        view = reader.view(run.run_id, None)
        reader.close()
        assert view.page_states is not None and view.row is not None
        assert view.page_states.counts().used == view.row.pages_used > 0
