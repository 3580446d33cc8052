"""Colours of page states and requests, shared by the page map, its legend and the
requests table, so a request reads the same colour everywhere."""

from __future__ import annotations

from textual.color import Color

from kvscope.db.page_states import (
    PAGE_OFFLOADED,
    STATE_CACHED,
    STATE_EVICTED,
    STATE_FREE,
    STATE_OFFLOADED,
    STATE_SHARED,
)
from kvscope.engine.events import PAGE_CACHED, PAGE_EVICTED, PAGE_FREE

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

# Colours of the db/page_states.py states (private pages take their request's colour).
PAGE_STATE_COLOURS = {
    STATE_FREE: STATE_COLOURS[PAGE_FREE],
    STATE_CACHED: STATE_COLOURS[PAGE_CACHED],
    STATE_OFFLOADED: STATE_COLOURS[PAGE_OFFLOADED],
    STATE_EVICTED: STATE_COLOURS[PAGE_EVICTED],
}
# Shared pages: one ivory hue, lighter the more requests hold the page
# (2, 3-4, 5-8, 9 or more holders).
SHARED_SHADES = ("#bfae7a", "#d6c895", "#e9dfb8", "#fbf6e4")


def shared_colour(holders: int) -> str:
    return SHARED_SHADES[0 if holders <= 2 else 1 if holders <= 4 else 2 if holders <= 8 else 3]


def state_colour(state: int, holder: int, holders: int) -> str:
    """A cell's colour from its page state (db/page_states.py)."""
    if state == STATE_SHARED:
        return shared_colour(holders)
    if holder >= 0 and state not in PAGE_STATE_COLOURS:
        return REQUEST_COLOURS[holder % len(REQUEST_COLOURS)]
    return PAGE_STATE_COLOURS.get(state, STATE_COLOURS[PAGE_FREE])


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
