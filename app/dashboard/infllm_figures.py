"""InfLLM views: which distant blocks each step attended, and resident vs offloaded KV.

Pure figure builders over ``db.infllm.retrievals`` rows, in the dashboard's
shared look; the Long context page (``long_context_page``) draws them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from kvscope.app.dashboard.figures import _empty, _figure
from kvscope.db.infllm import Retrieval

MIB = 2**20


def request_label(request_id: int) -> str:
    """'request 3'; -1 is the text ``kvscope eval perplexity`` scores (Engine.score's id)."""
    return "the scored text (eval perplexity)" if request_id < 0 else f"request {request_id}"


def block_heatmap(rows: Sequence[Retrieval], request_id: int) -> go.Figure:
    """Block x step: how many layers attended each distant block at each step of one request."""
    title = f"InfLLM retrieval, {request_label(request_id)}"
    fig = _figure(title, "distant block", "step", height=360)
    mine = [r for r in rows if r.request_id == request_id]
    if not mine:
        return _empty(fig, "no InfLLM retrievals for this request")
    steps = [r.step for r in mine]
    blocks = max(r.blocks_total for r in mine)
    z = np.zeros((blocks, len(mine)))
    for col, r in enumerate(mine):
        for block, layers in r.chosen.items():
            z[block, col] = layers
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=steps,
            y=list(range(blocks)),
            colorscale="Blues",
            colorbar={"title": "layers"},
            hovertemplate="step %{x}<br>block %{y}<br>%{z} layers<extra></extra>",
        )
    )
    fig.update_layout(hovermode="closest")
    return fig


def resident_bytes_figure(rows: Sequence[Retrieval]) -> go.Figure:
    """Device-resident vs host-offloaded KV (MiB) per request over steps."""
    fig = _figure("InfLLM: resident vs offloaded KV", "MiB", "step")
    if not rows:
        return _empty(fig, "no InfLLM retrievals in this run")
    for rid in sorted({r.request_id for r in rows}):
        mine = [r for r in rows if r.request_id == rid]
        steps = [r.step for r in mine]
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[r.resident_bytes / MIB for r in mine],
                name=f"req {rid} resident",
                mode="lines",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[r.offloaded_bytes / MIB for r in mine],
                name=f"req {rid} offloaded",
                mode="lines",
                line={"dash": "dot"},
            )
        )
    return fig
