"""The Kernels page's callbacks: time and throughput per kernel, the roofline, the
table with the device's peaks."""

from __future__ import annotations

from dash import Dash, Input, Output

from kvscope.app.dashboard import figures
from kvscope.app.dashboard.live import Reads, chosen_run, live
from kvscope.db import queries
from kvscope.db.queries import (
    kernel_stats,
    run_info,
)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _percent(fraction: float | None) -> float | None:
    """A share of the device's peak (db.kernels.device_peaks, as the roofline draws) in %."""
    return None if fraction is None else round(100 * fraction, 2)


def register(app: Dash, reads: Reads) -> None:
    @app.callback(
        Output("kernels-time", "figure"),
        Output("kernels-throughput", "figure"),
        Output("kernels-roofline", "figure"),
        Output("kernels-table", "data"),
        Input("version", "data"),
        Input("run", "value"),
    )
    def kernels(_: dict | None, run_id: int | None) -> tuple:
        run_id = chosen_run(run_id)
        with reads.reader() as db:
            stats = kernel_stats(db, run_id)
            peaks = queries.device_peaks(run_info(db, run_id))
        rows = [
            {
                "name": s.name,
                "calls": s.calls,
                "total_s": round(s.total_s, 4),
                "mean_ms": round(s.mean_s * 1e3, 4),
                "tflops": _round(s.tflops, 4),
                "gbps": _round(s.gbps, 2),
                "peak_tflops_pct": _percent(s.peak_tflops_frac),
                "peak_gbps_pct": _percent(s.peak_gbps_frac),
            }
            for s in stats
        ]
        return (
            live(figures.kernel_time_figure(stats), run_id),
            live(figures.kernel_throughput_figure(stats), run_id),
            live(figures.roofline_figure(stats, peaks), run_id),
            rows,
        )
