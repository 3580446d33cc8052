"""Calling a dashboard callback as Dash would, without a server or a browser."""

from __future__ import annotations

from dash._callback_context import context_value
from dash._utils import AttributeDict


def call(app, output: str, *args, trigger: str = "run.value"):
    """The callback of ``app`` that writes ``output``, called with ``args`` as if
    ``trigger`` had fired."""
    for key, spec in app.callback_map.items():
        if output in key.strip(".").split("..."):
            context_value.set(AttributeDict(triggered_inputs=[{"prop_id": trigger, "value": 1}]))
            return spec["callback"].__wrapped__(*args)
    raise KeyError(output)
