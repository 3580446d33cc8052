"""``kvscope simulate --db`` records each allocator as a 'simulation' run the front ends can read."""

from __future__ import annotations

import json

from app.cli import main
from db import queries


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
