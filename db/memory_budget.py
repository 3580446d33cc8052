"""Reads of the engine's measured memory budget (``MemoryBudgetMeasured``).

The engine records one event at start-up in the generic events table: how it
split device memory (weights, activations, framework overhead, KV cache) and
what ``kvscope calc`` predicts for the KV cache on the same device. Runs
recorded before the event existed have none: readers return None.
"""

from __future__ import annotations

import json
from dataclasses import fields, make_dataclass

from kvscope.db.source import Source, connection
from kvscope.engine.events import MemoryBudgetMeasured


def _terms(self) -> list[tuple[str, int, str]]:
    """(term, bytes, how it was obtained) for the four terms of the budget,
    then calc's predicted KV cache for the same device."""
    return [
        ("weights", self.weights_bytes, "measured"),
        ("activations", self.activation_bytes, _how(self.activations_measured)),
        ("framework overhead", self.overhead_bytes, _how(self.overhead_measured)),
        ("KV cache", self.kv_bytes, "allocated"),
        ("KV cache, calc predicts", self.predicted_kv_bytes, "kvscope calc"),
    ]


def _kv_vs_prediction(self) -> float | None:
    """The measured KV cache over calc's prediction (1.0: as predicted)."""
    return self.kv_bytes / self.predicted_kv_bytes if self.predicted_kv_bytes else None


# The event's fields less its time and step: one definition of what is recorded.
MeasuredBudget = make_dataclass(
    "MeasuredBudget",
    [(f.name, f.type) for f in fields(MemoryBudgetMeasured)[2:]],
    frozen=True,
    slots=True,
    namespace={"terms": _terms, "kv_vs_prediction": property(_kv_vs_prediction)},
)
MeasuredBudget.__module__ = __name__
MeasuredBudget.__doc__ = "A run's measured memory budget, as ``MemoryBudgetMeasured`` recorded it."


def _how(measured: bool) -> str:
    return "measured" if measured else "estimated"


def measured_budget(source: Source, run_id: int) -> MeasuredBudget | None:
    """The run's newest memory budget event, or None when it recorded none."""
    with connection(source) as conn:
        row = conn.execute(
            "SELECT payload FROM events WHERE run_id = ? AND kind = ? ORDER BY ts_ns DESC LIMIT 1",
            (run_id, MemoryBudgetMeasured.kind),
        ).fetchone()
    if row is None:
        return None
    p = json.loads(row[0])
    names = [f.name for f in fields(MeasuredBudget)]
    values = {name: p[name] for name in names}
    for flag in ("activations_measured", "overhead_measured"):
        values[flag] = bool(values[flag])  # SQLite's json_object stores booleans as 0/1
    return MeasuredBudget(**values)


def fixed_kv_budget(config: dict) -> int | None:
    """The KV budget a run was given (``--kv-budget``), or None when the engine sized
    it from ``--memory-fraction`` of the device: only then is ``kvscope calc``'s
    prediction a measure of the sizing."""
    fixed = config.get("kv_budget_bytes")
    return int(fixed) if fixed else None


# Where a fixed KV budget came from, as ``kvscope run`` records it (kv_budget_source).
USER_BUDGET = "--kv-budget"
GROWN_BUDGET = "grown"  # to fit the workload's longest requests
DEFAULT_BUDGET = "default"  # kvscope run's own, which the workload fitted


def kv_budget_source(config: dict) -> str:
    """How a fixed KV budget was chosen, in words for a heading; recordings from before
    the source was kept say what their flags say."""
    source = config.get("kv_budget_source")
    if source is None:
        source = GROWN_BUDGET if config.get("kv_budget_sized_to_workload") else USER_BUDGET
    if source == GROWN_BUDGET:
        longest = config.get("kv_budget_fit_requests", 2)
        return f"grown to fit {longest} of the workload's longest requests"
    if source == DEFAULT_BUDGET:
        return "kvscope run's default, which the workload fits"
    return "by --kv-budget"


def budget_title(budget: MeasuredBudget, config: dict) -> str:
    """The heading every front end puts over a run's memory budget."""
    device = f"{budget.device_bytes / 2**30:,.1f} GiB"
    fixed = fixed_kv_budget(config)
    if fixed is not None:
        return (
            f"Memory budget on {budget.device}: KV cache fixed at {fixed / 2**20:,.0f} MiB "
            f"{kv_budget_source(config)} (device {device}; calc's prediction is for "
            "--memory-fraction)"
        )
    return f"Memory budget on {budget.device} ({budget.memory_fraction:.0%} of {device})"


def budget_terms(budget: MeasuredBudget, config: dict) -> list[tuple[str, int, str]]:
    """``budget.terms()``, less calc's prediction when the budget was fixed."""
    terms = budget.terms()
    return terms[:-1] if fixed_kv_budget(config) is not None else terms
