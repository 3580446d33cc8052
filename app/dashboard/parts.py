"""The small pieces every page's layout and callbacks put on screen: a message in place
of what cannot be shown, and a row of headline tiles."""

from __future__ import annotations

from collections.abc import Sequence

from dash import html

from kvscope.app.dashboard.figures import Tile


def message(text: str) -> html.Div:
    return html.Div(text, className="message")


def tiles(items: Sequence[Tile]) -> list[html.Div]:
    return [
        html.Div(
            className="tile",
            children=[
                html.Div(t.label, className="tile-label"),
                html.Div(t.value, className="tile-value"),
                html.Div(t.detail, className="tile-detail"),
            ],
        )
        for t in items
    ]
