"""Colours of page states and requests, shared by the page map, its legend and the
requests table, so a request reads the same colour everywhere."""

from __future__ import annotations

from textual.color import Color

from db.pages import PAGE_OFFLOADED
from engine.events import PAGE_CACHED, PAGE_EVICTED, PAGE_FREE

STATE_COLOURS = {
    PAGE_FREE: "#3b4252",
    PAGE_CACHED: "#8c9bb0",
    PAGE_OFFLOADED: "#b07aa1",
    PAGE_EVICTED: "#e15759",
}
STATE_NAMES = {
    PAGE_FREE: "free",
    PAGE_CACHED: "cached",
    PAGE_OFFLOADED: "offloaded",
    PAGE_EVICTED: "evicted",
}

# Tableau 20 without its reds, purples and greys (those mean page states above).
REQUEST_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#edc948",
    "#76b7b2",
    "#ff9da7",
    "#a0cbe8",
    "#ffbe7d",
    "#8cd17d",
    "#b6992d",
    "#9c755f",
    "#86bcb6",
)

BACKGROUND = Color.parse("#1c1f26")


def owner_colour(owner: int) -> str:
    """A page owner's colour: a request's own colour, or its state's."""
    if owner >= 0:
        return REQUEST_COLOURS[owner % len(REQUEST_COLOURS)]
    return STATE_COLOURS[owner]


def faded(colour: str) -> str:
    """The colour pushed towards the background: other requests while one is selected."""
    return Color.parse(colour).blend(BACKGROUND, 0.7).hex
