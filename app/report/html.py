"""One self-contained HTML page per run: the summary and the main charts.

plotly.js is inlined once and the dashboard's stylesheet is inlined, so the
file opens offline, anywhere, with no server. The charts come from the same
figure builders as the dashboard.
"""

from __future__ import annotations

import datetime as dt
import html
import json

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from sqlite_utils import Database

from app.dashboard import figures
from app.dashboard.server import ASSETS
from db import queries
from db.queries import (
    gpu_series,
    kernel_stats,
    page_maps,
    run_info,
    run_summary,
    step_series,
)

# What a report page can show at print resolution, whatever the run's length.
MAX_POINTS = 600
MAX_SNAPSHOTS = 300
MAX_PAGE_ROWS = 256


def report_figures(db: Database, run_id: int) -> list[tuple[go.Figure, bool]]:
    """(figure, spans both columns) in page order; the GPU chart only with samples."""
    info = run_info(db, run_id)
    points = step_series(db, run_id, MAX_POINTS)
    stats = kernel_stats(db, run_id)
    gpu = gpu_series(db, run_id, MAX_POINTS)
    charts = [
        (figures.throughput_figure(points), True),
        (figures.page_heatmap(page_maps(db, run_id, MAX_SNAPSHOTS, MAX_PAGE_ROWS)), True),
        (figures.usage_figure(points), False),
        (figures.fragmentation_figure(points), False),
        (figures.hit_rate_figure(points), False),
        (figures.cached_sources_figure(queries.cached_sources(db, run_id, points)), False),
        (figures.event_counts_figure(queries.event_counts(db, run_id)), False),
        (figures.transfer_cost_figure(queries.transfer_costs(db, info)), False),
        (figures.kernel_time_figure(stats), False),
        (figures.roofline_figure(stats, queries.device_peaks(info)), False),
        (figures.queue_figure(points), True),
    ]
    if gpu:
        charts.append((figures.gpu_figure(gpu), True))
    return charts


def _tiles(tiles: list[figures.Tile]) -> str:
    return "".join(
        f'<div class="tile"><div class="tile-label">{html.escape(t.label)}</div>'
        f'<div class="tile-value">{html.escape(t.value)}</div>'
        f'<div class="tile-detail">{html.escape(t.detail)}</div></div>'
        for t in tiles
    )


def _config_rows(config: dict) -> str:
    return "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(json.dumps(v))}</td></tr>"
        for k, v in sorted(config.items())
    )


def build_html(db: Database, run_id: int) -> str:
    """The report page for one run, as a string."""
    info = run_info(db, run_id)
    summary = run_summary(db, run_id)
    started = dt.datetime.fromtimestamp(info.started_at, dt.timezone.utc)
    charts = "".join(
        f'<div class="card{" wide" if wide else ""}">'
        + pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            config={"displaylogo": False, "responsive": True},
        )
        + "</div>"
        for fig, wide in report_figures(db, run_id)
    )
    title = f"kvscope run #{run_id}"
    subtitle = " · ".join(
        html.escape(str(part))
        for part in (
            info.kind,
            info.model or "no model",
            info.status,
            f"started {started:%Y-%m-%d %H:%M:%S} UTC",
            f"{info.steps:,} steps",
            f"{info.events_written:,} events",
        )
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{(ASSETS / "dashboard.css").read_text()}</style>
<style>
header.report {{ padding: 18px 24px; background: var(--ink); color: #f8fafc; }}
header.report h1 {{ margin: 0 0 4px; font-size: 22px; }}
header.report p {{ margin: 0; color: #94a3b8; }}
section {{ margin-bottom: 16px; }}
table.config {{ border-collapse: collapse; font-size: 13px; }}
table.config th {{ text-align: left; padding: 4px 16px 4px 8px; color: var(--muted); }}
table.config td {{ font-family: ui-monospace, monospace; padding: 4px 8px; }}
</style>
<script>{get_plotlyjs()}</script>
</head>
<body>
<header class="report"><h1>{title}</h1><p>{subtitle}</p></header>
<main class="page">
<section class="tiles">{_tiles(figures.summary_tiles(summary))}</section>
<section class="grid">{charts}</section>
<section class="card"><h3>Configuration</h3><table class="config">{_config_rows(info.config)}</table></section>
</main>
</body>
</html>
"""
