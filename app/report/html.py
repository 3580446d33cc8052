"""One self-contained HTML page per run: the summary and the main charts.

plotly.js is inlined once and the dashboard's stylesheet is inlined, so the
file opens offline, anywhere, with no server. The charts come from the same
figure builders as the dashboard: a watched deployment (run kind ``watch``)
gets its page's figures and tables instead of the engine's.
"""

from __future__ import annotations

import datetime as dt
import html
import json

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from sqlite_utils import Database

from kvscope.app.dashboard import capacity_page, figures, watch_page
from kvscope.app.dashboard.server import ASSETS
from kvscope.db import queries
from kvscope.db.memory_budget import budget_title, measured_budget
from kvscope.db.miss_reasons import run_miss_reasons
from kvscope.db.page_replay import page_state_matrix
from kvscope.db.queries import (
    gpu_series,
    kernel_stats,
    page_maps,
    requests_table,
    run_info,
    run_summary,
    step_series,
)
from kvscope.db.watch_snapshot import WatchSnapshot, watch_snapshot

# What a report page can show at print resolution, whatever the run's length.
MAX_POINTS = 600
MAX_SNAPSHOTS = 300
MAX_PAGE_ROWS = 256


def _page_figure(db: Database, run_id: int) -> go.Figure:
    """Exact page states at every column (db/page_states.py), or for a recording
    without page holds its snapshots."""
    states = page_state_matrix(db, run_id, MAX_SNAPSHOTS, MAX_PAGE_ROWS)
    if states is not None:
        return figures.page_state_heatmap(states)
    return figures.page_heatmap(page_maps(db, run_id, MAX_SNAPSHOTS, MAX_PAGE_ROWS))


def report_figures(db: Database, run_id: int) -> list[tuple[go.Figure, bool]]:
    """(figure, spans both columns) in page order; the GPU chart only with samples."""
    info = run_info(db, run_id)
    points = step_series(db, run_id, MAX_POINTS)
    stats = kernel_stats(db, run_id)
    gpu = gpu_series(db, run_id, MAX_POINTS)
    charts = [
        (figures.throughput_figure(points), True),
        (_page_figure(db, run_id), True),
        (figures.usage_figure(points), False),
        (figures.fragmentation_figure(points), False),
        (figures.hit_rate_figure(points), False),
        (capacity_page.miss_reasons_figure(run_miss_reasons(db, run_id)), False),
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


def watch_figures(
    db: Database, run_id: int, data: WatchSnapshot | None = None
) -> list[tuple[go.Figure, bool]]:
    """A watch run's charts: cached blocks, misses, residency, duplication, /metrics."""
    data = data or watch_snapshot(db, run_id)
    labels = {s.source: s.label for s in data.sources}
    return [
        (watch_page.cached_blocks_figure(data.cached_series, labels), True),
        (watch_page.misses_figure(data.miss_series), True),
        (watch_page.histograms_figure(data.histograms), True),
        *(
            [(watch_page.histograms_figure(data.residency, watch_page.VLLM_RESIDENCY_TITLE), True)]
            if data.residency
            else []
        ),
        (watch_page.cache_sources_figure(data.cache_sources), True),
        (watch_page.duplication_figure(data.duplicate_series), True),
        *((watch_page.engine_metrics_figure(series), True) for series in data.engines),
    ]


def _watch_tables(db: Database, run_id: int, data: WatchSnapshot | None = None) -> str:
    data = data or watch_snapshot(db, run_id)
    tables = (
        ("Sources", watch_page.source_rows(data.sources)),
        ("Blocks per source", watch_page.block_rows(data.stats)),
        ("Misses: more KV cache, or a better router?", watch_page.miss_rows(data.misses)),
        ("Duplicated KV across replicas", watch_page.duplication_rows(data.duplication)),
        ("Largest shared prefixes", watch_page.prefix_rows(data.prefixes)),
        ("Incidents (newest)", watch_page.incident_rows(data.incidents)),
    )
    return "".join(
        f'<section class="card"><h3>{html.escape(title)}</h3>{_rows_table(rows)}</section>'
        for title, rows in tables
    )


def _rows_table(rows: list[dict]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>"
        for row in rows
    )
    return f'<table class="rows"><tr>{head}</tr>{body}</table>'


REQUEST_ROWS = 2000  # the page's table; csv has every request


def _fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "" if value is None else f"{value * scale:.{digits}f}"


def _requests(db: Database, run_id: int) -> str:
    """One row per request: when it came and waited, TTFT, TPOT, tokens, prefix hits,
    preemptions and how it ended (the first ``REQUEST_ROWS``)."""
    rows = requests_table(db, run_id)
    shown = [
        {
            "request": r.request_id,
            "status": r.status,
            "arrival s": _fmt(r.arrival_s),
            "queue s": _fmt(r.queue_s),
            "TTFT s": _fmt(r.ttft_s),
            "TPOT ms": _fmt(r.tpot_s, 1e3, 2),
            "e2e s": _fmt(r.e2e_s),
            "prompt": r.prompt_tokens,
            "output": r.output_tokens,
            "cached": r.cached_tokens,
            "preempted": r.preemptions,
            "finish": r.finish_reason or r.rejected_reason or "",
        }
        for r in rows[:REQUEST_ROWS]
    ]
    more = (
        f"<p>The first {REQUEST_ROWS:,} of {len(rows):,}; <code>kvscope report --format csv"
        "</code> has every request.</p>"
        if len(rows) > REQUEST_ROWS
        else ""
    )
    return f'<section class="card"><h3>Requests</h3>{_rows_table(shown)}{more}</section>'


def _budget(db: Database, run_id: int) -> str:
    """The measured memory budget next to calc's prediction; nothing for runs without one."""
    budget = measured_budget(db, run_id)
    if budget is None:
        return ""
    config = run_info(db, run_id).config
    title = budget_title(budget, config)
    return (
        f'<section class="card"><h3>{html.escape(title)}</h3>'
        f'<div class="tiles">{_tiles(figures.budget_tiles(budget, config))}</div></section>'
    )


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
    watched = info.kind == "watch"
    data = watch_snapshot(db, run_id) if watched else None  # queried once for both parts
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
        for fig, wide in (
            watch_figures(db, run_id, data) if watched else report_figures(db, run_id)
        )
    )
    if watched:
        summary = _watch_tables(db, run_id, data)
    else:
        summary = (
            f'<section class="tiles">{_tiles(figures.summary_tiles(run_summary(db, run_id), info.config))}'
            f"</section>{_budget(db, run_id)}"
        )
    requests = "" if watched else _requests(db, run_id)
    title = f"kvscope run #{run_id}"
    subtitle = " · ".join(
        html.escape(str(part))
        for part in (
            info.kind,
            info.subject or "no model",
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
table.rows {{ border-collapse: collapse; font-size: 13px; }}
table.rows th, table.rows td {{ text-align: left; padding: 4px 10px; border-bottom: 1px solid #e2e8f0; }}
</style>
<script>{get_plotlyjs()}</script>
</head>
<body>
<header class="report"><h1>{title}</h1><p>{subtitle}</p></header>
<main class="page">
{summary}
<section class="grid">{charts}</section>
{requests}
<section class="card"><h3>Configuration</h3><table class="config">{_config_rows(info.config)}</table></section>
</main>
</body>
</html>
"""
