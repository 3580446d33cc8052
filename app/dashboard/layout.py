"""The dashboard's component trees: the shell (header, run picker, navigation,
refresh timer) and one layout per page. Ids here are the contract with
``callbacks``; nothing in this module reads data.
"""

from __future__ import annotations

from pathlib import Path

from dash import dash_table, dcc, html

from kvscope.app.dashboard import capacity_page, long_context_page, sizing_page, watch_page
from kvscope.app.dashboard.figures import TABLE_STYLE
from kvscope.app.dashboard.parts import message

# (key, label, path): the key prefixes every component id on the page.
PAGES = (
    ("overview", "Overview", "/"),
    ("kv-cache", "KV cache", "/kv-cache"),
    ("prefix-cache", "Prefix cache", "/prefix-cache"),
    ("eviction", "Eviction & offload", "/eviction"),
    ("kernels", "Kernels", "/kernels"),
    ("gpu", "GPU", "/gpu"),
    ("requests", "Requests", "/requests"),
    long_context_page.PAGE,
    ("compare", "Compare runs", "/compare"),
    watch_page.PAGE,
    sizing_page.PAGE,
    capacity_page.PAGE,
)
PAGE_BY_PATH = {path: key for key, _, path in PAGES}
LABELS = {key: label for key, label, _ in PAGES}
# Pages over kvscope's own engine runs: a watched deployment (run kind
# ``watch``) has no steps, pages or kernels of its own.
ENGINE_PAGES = frozenset(
    ("overview", "kv-cache", "prefix-cache", "eviction", "kernels", "gpu", "requests")
    + (long_context_page.PAGE[0],)
)

# Requests per page of the requests table (paged server-side).
REQUESTS_PAGE_SIZE = 20


def shell(db_path: Path, refresh_ms: int) -> html.Div:
    """Everything around the page: the timer and stores that drive live refresh,
    the run picker, the navigation and the page container."""
    return html.Div(
        className="app",
        children=[
            dcc.Location(id="url"),
            dcc.Interval(id="tick", interval=refresh_ms),
            dcc.Store(id="version"),
            html.Header(
                className="topbar",
                children=[
                    html.Div(
                        className="brand",
                        children=[html.Span("kvscope"), html.Small(str(db_path), id="db-path")],
                    ),
                    html.Div(
                        className="run-picker",
                        children=[
                            html.Label("run", htmlFor="run"),
                            dcc.Dropdown(id="run", clearable=False, searchable=False),
                            html.Span(id="run-status", className="badge"),
                        ],
                    ),
                ],
            ),
            html.Nav(
                className="nav",
                children=[
                    dcc.Link(label, href=path, id=f"nav-{key}", className="nav-link")
                    for key, label, path in PAGES
                ],
            ),
            html.Main(id="page", className="page"),
        ],
    )


def _graph(graph_id: str, wide: bool = False) -> html.Div:
    return html.Div(
        className="card wide" if wide else "card",
        children=dcc.Graph(
            id=graph_id,
            # A figure to patch even if a refresh overtakes the first full draw.
            figure={"data": [], "layout": {}},
            config={"displaylogo": False, "responsive": True},
            className="graph",
        ),
    )


def _table(table_id: str, **kwargs: object) -> dash_table.DataTable:
    return dash_table.DataTable(id=table_id, **TABLE_STYLE, **kwargs)


def page(key: str) -> html.Div:
    """The layout of one page, empty until its callback fills it."""
    return html.Div(className="grid", id=f"{key}-page", children=_PAGES[key]())


def _overview() -> list:
    return [
        html.Div(id="overview-tiles", className="tiles wide"),
        html.Div(id="overview-budget", className="wide"),
        _graph("overview-throughput", wide=True),
        _graph("overview-queues", wide=True),
    ]


def _kv_cache() -> list:
    return [
        _graph("kv-cache-heatmap", wide=True),
        _graph("kv-cache-usage"),
        _graph("kv-cache-fragmentation"),
    ]


def _prefix_cache() -> list:
    return [
        _graph("prefix-cache-hit-rate", wide=True),
        _graph("prefix-cache-sources"),
        _graph("prefix-cache-size"),
    ]


def _eviction() -> list:
    return [
        _graph("eviction-timeline", wide=True),
        _graph("eviction-costs"),
        html.Div(
            className="card",
            children=[
                html.H3("Latest events"),
                _table(
                    "eviction-events",
                    columns=[
                        {"name": "t (s)", "id": "t_s", "type": "numeric"},
                        {"name": "step", "id": "step", "type": "numeric"},
                        {"name": "event", "id": "kind"},
                        {"name": "request", "id": "request_id", "type": "numeric"},
                        {"name": "details", "id": "details"},
                    ],
                    page_size=12,
                ),
            ],
        ),
    ]


def _kernels() -> list:
    return [
        _graph("kernels-time"),
        _graph("kernels-throughput"),
        _graph("kernels-roofline", wide=True),
        html.Div(
            className="card wide",
            children=[
                html.H3("Kernels"),
                _table(
                    "kernels-table",
                    columns=[
                        {"name": "kernel", "id": "name"},
                        {"name": "calls", "id": "calls", "type": "numeric"},
                        {"name": "total (s)", "id": "total_s", "type": "numeric"},
                        {"name": "mean (ms)", "id": "mean_ms", "type": "numeric"},
                        {"name": "TFLOP/s", "id": "tflops", "type": "numeric"},
                        {"name": "GB/s", "id": "gbps", "type": "numeric"},
                        {"name": "% peak FLOP/s", "id": "peak_tflops_pct", "type": "numeric"},
                        {"name": "% peak GB/s", "id": "peak_gbps_pct", "type": "numeric"},
                    ],
                ),
            ],
        ),
    ]


def _gpu() -> list:
    return [html.Div(id="gpu-note", className="wide"), _graph("gpu-samples", wide=True)]


REQUEST_COLUMNS = (
    ("request", "request_id", "numeric"),
    ("status", "status", "text"),
    ("arrival (s)", "arrival_s", "numeric"),
    ("queue (s)", "queue_s", "numeric"),
    ("TTFT (s)", "ttft_s", "numeric"),
    ("TPOT (s)", "tpot_s", "numeric"),
    ("end-to-end (s)", "e2e_s", "numeric"),
    ("prompt", "prompt_tokens", "numeric"),
    ("output", "output_tokens", "numeric"),
    ("cached", "cached_tokens", "numeric"),
    ("preempted", "preemptions", "numeric"),
    ("finish", "finish_reason", "text"),
    # Why its prompt tokens missed the prefix cache (db/miss_reasons.py).
    ("missed: cold", "missed_cold", "numeric"),
    ("capacity", "missed_capacity", "numeric"),
    ("granularity", "missed_granularity", "numeric"),
    ("last token", "missed_last_token", "numeric"),
    # Its pages at the newest step: private + shared, and those it would free if it
    # finished now (db/requests.py, the TUI's figures).
    ("pages", "pages", "numeric"),
    ("private", "private_pages", "numeric"),
    ("shared", "shared_pages", "numeric"),
    ("would free", "would_free", "numeric"),
)


def _requests() -> list:
    return [
        html.Div(
            className="card wide",
            children=[
                html.H3("Requests"),
                html.P(
                    "Filter in the header row (e.g. > 0.5, finished); choose a row to see its "
                    "pages and tokens over time.",
                    className="hint",
                ),
                _table(
                    "requests-table",
                    columns=[
                        {
                            "name": name,
                            "id": key,
                            "type": kind,
                            "format": {"specifier": ".4~f"} if key.endswith("_s") else None,
                        }
                        for name, key, kind in REQUEST_COLUMNS
                    ],
                    page_action="custom",
                    page_current=0,
                    page_size=REQUESTS_PAGE_SIZE,
                    filter_action="custom",
                    filter_query="",
                    filter_options={"placeholder_text": "filter", "case": "insensitive"},
                    sort_action="custom",
                    sort_mode="multi",
                    sort_by=[],
                    row_selectable="single",
                    selected_row_ids=[],
                ),
            ],
        ),
        _graph("requests-detail", wide=True),
        _graph("requests-pages", wide=True),  # the selected request's pages, shared ones too
    ]


def _compare() -> list:
    return [
        html.Div(
            className="card wide",
            children=[
                html.H3("Runs to compare"),
                dcc.Dropdown(id="compare-runs", multi=True, placeholder="choose two or more runs"),
            ],
        ),
        html.Div(
            className="card",
            children=[html.H3("Summary"), _table("compare-summary")],
        ),
        html.Div(
            className="card",
            children=[html.H3("Config differences"), _table("compare-config")],
        ),
        _graph("compare-throughput"),
        _graph("compare-hit-rate"),
        _graph("compare-token-usage"),
        _graph("compare-page-usage"),
    ]


_PAGES = {
    "overview": _overview,
    "kv-cache": _kv_cache,
    "prefix-cache": _prefix_cache,
    "eviction": _eviction,
    "kernels": _kernels,
    "gpu": _gpu,
    "requests": _requests,
    "compare": _compare,
    long_context_page.PAGE[0]: long_context_page.layout,
    watch_page.PAGE[0]: watch_page.page_layout,
    sizing_page.PAGE[0]: sizing_page.layout,
    capacity_page.PAGE[0]: capacity_page.layout,
}


def not_applicable(key: str, run_id: int, kind: str) -> html.Div:
    """What a page says for a run it has nothing to show for."""
    if kind == "watch":
        return message(
            f"Run #{run_id} is a watched deployment: the {LABELS[key]} page shows kvscope's "
            f"own engine runs. See {LABELS[watch_page.PAGE[0]]}."
        )
    return message(
        f"Run #{run_id} is {'an' if kind[:1] in 'aeiou' else 'a'} {kind} run, not a watched "
        "deployment: record one with kvscope watch."
    )
