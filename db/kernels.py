"""Reads of kernel timings and transfer costs, against the device they ran on.

``device_peaks`` is the one answer to "peak of what": the measured GPU when the
run recorded one, else the device preset of the run's cost model (a CPU run
reads against the ``cpu`` preset). ``kernel_stats``' %peak figures, the TUI's
kernel panel and the dashboard's roofline all use it. ``transfer_costs`` puts
measured offload/reload/recompute costs beside engine.sizing's cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvscope.db import formulas
from kvscope.db.formulas import KernelStat
from kvscope.db.runs import RunInfo, cost_device, page_size, run_info
from kvscope.db.source import Source, connection, run_origin, window
from kvscope.engine.events import PageOffloaded, PageReloaded
from kvscope.engine.sizing import reload_cost


@dataclass(frozen=True, slots=True)
class DevicePeaks:
    """The roofline's ceilings: the run's measured device, else its cost-model preset."""

    tflops: float | None
    gbps: float | None
    source: str  # what the peaks are of, for captions


def device_peaks(info: RunInfo) -> DevicePeaks:
    hardware = info.hardware
    if hardware.get("peak_tflops") or hardware.get("peak_gbps"):
        gpus = hardware.get("gpus") or [{}]
        name = gpus[0].get("name", "this run's GPU")
        return DevicePeaks(hardware.get("peak_tflops"), hardware.get("peak_gbps"), name)
    device = cost_device(info)
    if device is not None:
        return DevicePeaks(device.fp16_tflops, device.hbm_gbps, f"preset {device.name}")
    return DevicePeaks(None, None, "unknown device")


def kernel_stats(
    source: Source, run_id: int, since_s: float | None = None, until_s: float | None = None
) -> list[KernelStat]:
    """Per kernel name: calls, total and mean seconds, achieved TFLOP/s and GB/s,
    and their fraction of ``device_peaks``. Most total time first."""
    with connection(source) as conn:
        peaks = device_peaks(run_info(conn, run_id))
        lo, hi = window(run_origin(conn, run_id), since_s, until_s)
        rows = conn.execute(
            """SELECT name, COUNT(*), SUM(seconds), SUM(flops), SUM(bytes) FROM kernels
               WHERE run_id = ? AND ts_ns BETWEEN ? AND ?
               GROUP BY name ORDER BY SUM(seconds) DESC""",
            (run_id, lo, hi),
        ).fetchall()
    return [
        formulas.kernel_stat(
            name, calls, seconds, flops or 0.0, nbytes or 0.0, peaks.tflops, peaks.gbps
        )
        for name, calls, seconds, flops, nbytes in rows
    ]


@dataclass(frozen=True, slots=True)
class TransferCost:
    """Seconds per page of one way to get a page's KV back (or out)."""

    action: str  # offload | reload | recompute
    samples: int  # measurements behind ``measured_s``
    measured_s: float | None
    predicted_s: float | None  # the cost model's figure; None when its inputs were not recorded


def transfer_costs(source: Source, info: RunInfo) -> list[TransferCost]:
    """Measured seconds per page beside engine.sizing's recompute-vs-load model
    (the one ``--offload auto`` decides with), per page.

    Transfers are measured per event. Recompute is the marginal cost of a
    prefill token, fitted by least squares to step durations against prefill
    and decode tokens, times the page size. Predictions need the run's config
    to name a cost device and carry ``kv_bytes_per_token`` and ``params``.
    """
    run_id = info.run_id
    device = cost_device(info)
    kv_bytes = info.config.get("kv_bytes_per_token")
    params = info.config.get("params")
    with connection(source) as conn:
        tokens_per_page = page_size(conn, run_id) or info.config.get("page_size")
        model = (
            reload_cost(params, kv_bytes, device.pcie_gbps, device.fp16_tflops)
            if device and kv_bytes and params
            else None
        )
        transfer_s = model.load_s * tokens_per_page if model and tokens_per_page else None
        recompute_s = model.recompute_s * tokens_per_page if model and tokens_per_page else None
        costs = []
        for action, kind in (("offload", PageOffloaded.kind), ("reload", PageReloaded.kind)):
            count, mean = conn.execute(
                """SELECT COUNT(*), AVG(json_extract(payload, '$.seconds')) FROM events
                   WHERE run_id = ? AND kind = ?""",
                (run_id, kind),
            ).fetchone()
            costs.append(TransferCost(action, count, mean, transfer_s))
        samples, per_token = _prefill_seconds_per_token(conn, run_id)
    measured = per_token * tokens_per_page if per_token and tokens_per_page else None
    costs.append(TransferCost("recompute", samples, measured, recompute_s))
    return costs


def _prefill_seconds_per_token(
    conn, run_id: int, max_steps: int = 20_000
) -> tuple[int, float | None]:
    """(steps used, marginal seconds per prefill token), from an evenly thinned
    sample of steps so the fit costs the same on any run."""
    (steps,) = conn.execute("SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,)).fetchone()
    every = max(1, steps // max_steps)
    rows = np.array(
        conn.execute(
            """SELECT duration_s, prefill_tokens, decode_tokens FROM steps
               WHERE run_id = ? AND step % ? = 0""",
            (run_id, every),
        ).fetchall(),
        dtype=np.float64,
    ).reshape(-1, 3)
    design = np.column_stack([np.ones(len(rows)), rows[:, 1], rows[:, 2]])
    if len(rows) < 3 or np.linalg.matrix_rank(design) < 3:
        return len(rows), None
    coef = np.linalg.lstsq(design, rows[:, 0], rcond=None)[0]
    return len(rows), float(coef[1]) if coef[1] > 0 else None
