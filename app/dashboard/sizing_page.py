"""The dashboard's Sizing page: the throughput cliff for a model preset on a device preset.

The numbers are ``kvscope calc cliff``'s own: the page parses the same flags
with the CLI's parser and calls ``app.cliff.cliff_report`` and
``cliff_figure``, so the chart and the command never disagree. It reads no
database: any run (or none) shows it.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html

from kvscope.app.cliff import cliff_figure, cliff_report
from kvscope.app.dashboard import figures, parts
from kvscope.app.dashboard.figures import FONT, Tile
from kvscope.app.dashboard.live import Reads
from kvscope.engine.attention_presets import SIZING_PRESETS
from kvscope.engine.errors import KvscopeError
from kvscope.engine.presets import DEVICES, MODELS
from kvscope.engine.sizing import KV_DTYPES

PAGE = ("sizing", "Sizing", "/sizing")
# The engine's presets, then the models it only sizes (sliding, chunked, MLA, state).
PRESETS = [*MODELS, *SIZING_PRESETS]
DEFAULTS = {"model": "llama3-8b", "device": "h100-80", "kv_dtype": "fp8_e4m3", "resident": 25}


def cliff(model: str, device: str, kv_dtype: str, resident_pct: float | None) -> dict[str, Any]:
    """``kvscope calc cliff --preset MODEL --device DEVICE --kv-dtype KV_DTYPE
    [--resident-tokens PCT%]`` as a dict (its ``--json``)."""
    from kvscope.app.cli import build_parser  # the CLI's own flags and defaults

    # A cleared control sends None: say which one, as the CLI would (its parser raises
    # KvscopeError, never exits: a callback must not end the dashboard's server).
    for name, value, choices in (
        ("model", model, PRESETS),
        ("device", device, DEVICES),
        ("KV dtype", kv_dtype, KV_DTYPES),
    ):
        if not isinstance(value, str) or value not in choices:
            raise KvscopeError(f"choose a {name}: one of {', '.join(choices)}")
    if resident_pct is not None and (
        not isinstance(resident_pct, (int, float)) or not 0 <= resident_pct <= 100
    ):
        raise KvscopeError(f"InfLLM resident share must be 0-100%, got {resident_pct!r}")
    argv = ["calc", "cliff", "--preset", model, "--device", device, "--kv-dtype", kv_dtype]
    if resident_pct:
        argv += ["--resident-tokens", f"{resident_pct:g}%"]
    return cliff_report(build_parser().parse_args(argv))


def cliff_chart(report: dict[str, Any]) -> go.Figure:
    """``cliff_figure`` in the dashboard's look."""
    fig = cliff_figure(report)
    fig.update_layout(
        height=520,
        font={"family": FONT, "size": 13},
        margin={"l": 70, "r": 30, "t": 60, "b": 50},
        legend={"orientation": "h", "y": -0.15},
    )
    return fig


def cliff_tiles(report: dict[str, Any]) -> list[Tile]:
    """The compute-bound batch, then each scenario's cliff and batch at input+output tokens."""
    context = f"{report['input_tokens']:,}+{report['output_tokens']:,}"
    tiles = [
        Tile(
            "compute-bound batch",
            f"{report['compute_bound_batch']:,.0f}",
            f"{report['tflops']:,g} TFLOP/s over {report['hbm_gbps']:,g} GB/s",
        )
    ]
    for name, s in report["scenarios"].items():
        length = s["cliff_context_len"]
        tiles.append(
            Tile(
                name,
                "no cliff" if length is None else f"cliff at {length:,}",
                f"average batch {s['batch_at_input_output']:,} at {context} tokens",
            )
        )
    return tiles


def _dropdown(key: str, options: list[str], value: str) -> html.Div:
    return html.Div(
        className="control",
        children=[
            html.Label(key.replace("_", " "), htmlFor=f"sizing-{key}"),
            dcc.Dropdown(
                id=f"sizing-{key}",
                options=options,
                value=value,
                clearable=False,
                searchable=False,
            ),
        ],
    )


def layout() -> list:
    """The controls, the headline tiles and the chart."""
    return [
        html.Div(
            className="card wide controls",
            children=[
                html.H3("The throughput cliff (kvscope calc cliff)"),
                html.Div(
                    className="control-row",
                    children=[
                        _dropdown("model", PRESETS, DEFAULTS["model"]),
                        _dropdown("device", list(DEVICES), DEFAULTS["device"]),
                        _dropdown(
                            "kv_dtype",
                            [k for k in KV_DTYPES if k != "fp16"],
                            DEFAULTS["kv_dtype"],
                        ),
                        html.Div(
                            className="control",
                            children=[
                                html.Label("InfLLM resident %", htmlFor="sizing-resident"),
                                dcc.Slider(
                                    id="sizing-resident",
                                    min=0,
                                    max=100,
                                    step=5,
                                    value=DEFAULTS["resident"],
                                    marks={v: f"{v}%" for v in (0, 25, 50, 75, 100)},
                                ),
                            ],
                        ),
                    ],
                ),
                html.P(
                    "0% resident: no InfLLM scenario. Budget: the device's memory minus weights "
                    "and calc's default overhead; prompt:output 1024:1024.",
                    className="hint",
                ),
            ],
        ),
        html.Div(id="sizing-tiles", className="tiles wide"),
        html.Div(
            className="card wide",
            children=dcc.Graph(
                id="sizing-cliff",
                figure={"data": [], "layout": {}},
                config={"displaylogo": False, "responsive": True},
                className="graph",
            ),
        ),
    ]


def register(app: Dash, reads: Reads) -> None:
    """This page's callbacks."""

    @app.callback(
        Output("sizing-tiles", "children"),
        Output("sizing-cliff", "figure"),
        Input("sizing-model", "value"),
        Input("sizing-device", "value"),
        Input("sizing-kv_dtype", "value"),
        Input("sizing-resident", "value"),
    )
    def sizing(model: str, device: str, kv_dtype: str, resident: float | None) -> tuple:
        try:
            report = cliff(model, device, kv_dtype, resident)
        except KvscopeError as exc:
            fig = figures._empty(figures._figure("The throughput cliff"), str(exc))
            return parts.message(str(exc)), fig
        return (
            parts.tiles(cliff_tiles(report)),
            cliff_chart(report),
        )
