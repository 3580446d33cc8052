"""The one definition of what state a KV page is in at one step.

Every front end (the TUI page map, the dashboard heatmap, the HTML report) and
every figure in ``db/`` reads page states from here, so a page coloured "shared"
in the terminal is the page counted "shared" in the report. A page is in
exactly one state at the end of every step:

=========  ===================================================================
state      meaning
=========  ===================================================================
free       in the device pool's free list (and not evicted this step)
private    held by exactly one request (``holder`` is its id)
shared     held by N >= 2 requests (``holders`` is N, ``holder`` the lowest id)
cached     in the prefix tree, no request references it: evictable
offloaded  evicted this step, its content moved to the host tier (device page free)
evicted    evicted this step and dropped (device page free)
=========  ===================================================================

Precedence when a page went through several states within one step: a holder
wins (private/shared), then the prefix tree (cached), then an eviction of this
step (the last one's action: offloaded or evicted), then free. A page that is
held *and* in the prefix tree is private or shared (the tree copy is the same
page); ``StepPages.in_tree`` keeps tree membership separately, so "cached pages
are a subset of tree pages" can be checked.

A reconstructed step (``StepPages``) is per page: a state code (int8), a holder
count (int32) and one holder id (int32, -1 when nobody holds it), the tree
membership (bool); and per request its full page list (shared pages included,
in the request's own order). It is built by ``step_pages_from`` from holds,
tree pages and this step's evictions: ``db.pages.step_pages`` builds it from
the recording, the test probe (tests/page_probe.py) from the live engine, so
both sides of the proof run the same constructor.

Many pages per cell (a GPU-sized pool on a terminal): a cell shows its
*dominant* state, the state most of its pages are in, ties going to the later
state in ``STATES`` order (shared > private > evicted > offloaded > cached >
free: the rarer, more telling state wins). ``cell_mix`` gives every cell's
count of pages per state, for legends and hovers.

What readers call:

- ``db.pages.step_pages(source, run_id, step)``: the reconstructed ``StepPages``
  at a step (exact; the recorded snapshot at or before it plus the page events
  since).
- ``StepPages.counts()``: the ``StateCounts`` figures (and ``.invariant_errors()``).
- ``StepPages.request_holdings(rid)``: private / shared / would-free pages of one request.
- ``StepPages.owners()``: the legacy owner codes (request id >= 0, ``PAGE_*`` < 0)
  for code that colours by owner.
- ``cell_states(state, per_cell)``, ``cell_mix(state, per_cell)``,
  ``cell_holders(holders, per_cell)``, ``cell_holder(holder, per_cell)``,
  ``cell_any(mask, per_cell)``: aggregation for drawing.
- ``STATES`` / ``STATE_NAMES`` and the ``STATE_*`` codes for legends.

Legacy owner codes (``engine.events.PAGE_FREE``/``PAGE_CACHED``/``PAGE_EVICTED``
and ``PAGE_OFFLOADED`` defined here, re-exported by ``db.pages``) stay valid in
the stored ``owners`` arrays of page-map snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from kvscope.engine.events import PAGE_CACHED, PAGE_EVICTED, PAGE_FREE

# A legacy owner code the engine's snapshots do not have: evicted to the host tier.
PAGE_OFFLOADED = -4

STATE_FREE = 0
STATE_CACHED = 1
STATE_OFFLOADED = 2
STATE_EVICTED = 3
STATE_PRIVATE = 4
STATE_SHARED = 5
STATES = ("free", "cached", "offloaded", "evicted", "private", "shared")
STATE_NAMES = dict(enumerate(STATES))
NUM_STATES = len(STATES)
_PADDING = -1  # fills the last cell of an aggregation; in no state

# Legacy owner code of each non-held state (held states use the holder id).
_LEGACY_CODE = np.array(
    [PAGE_FREE, PAGE_CACHED, PAGE_OFFLOADED, PAGE_EVICTED, 0, 0], dtype=np.int32
)

# Eviction actions as the engine names them (PageEvicted.action).
OFFLOADED_ACTION = "offloaded"
DROPPED_ACTION = "dropped"


@dataclass(frozen=True, slots=True)
class StateCounts:
    """Pages per state at one step, and the figures every front end shows."""

    free: int  # free, not evicted this step
    private: int
    shared: int  # distinct shared pages (each counted once)
    cached: int
    offloaded: int
    evicted: int
    tree: int  # device pages in the prefix tree (held or not)
    references: int  # request references: a page shared by N counts N times

    @property
    def used(self) -> int:
        """Pages some request holds."""
        return self.private + self.shared

    @property
    def unused(self) -> int:
        """Pages in the free list: free, plus evicted or offloaded this step."""
        return self.free + self.offloaded + self.evicted

    @property
    def pool(self) -> int:
        return self.used + self.cached + self.unused


@dataclass(frozen=True, slots=True)
class RequestHoldings:
    """One request's pages at one step."""

    request_id: int
    pages: np.ndarray  # all it holds, in its own order (shared ones included)
    private: int  # pages only it holds
    shared: int  # pages it holds with others
    would_free: int  # pages that return to the free list if it finished now

    @property
    def held(self) -> int:
        return self.private + self.shared


@dataclass(frozen=True, slots=True)
class StepPages:
    """Every page's state at the end of one step (see the module docstring)."""

    step: int
    state: np.ndarray  # int8 STATE_* per page
    holders: np.ndarray  # int32 requests holding each page
    holder: np.ndarray  # int32 lowest holding request id, -1 if none
    in_tree: np.ndarray  # bool: the page is in the prefix tree
    request_pages: Mapping[int, np.ndarray]  # request id -> its pages (int64)

    @property
    def num_pages(self) -> int:
        return len(self.state)

    def counts(self) -> StateCounts:
        per_state = np.bincount(self.state, minlength=NUM_STATES)
        return StateCounts(
            free=int(per_state[STATE_FREE]),
            private=int(per_state[STATE_PRIVATE]),
            shared=int(per_state[STATE_SHARED]),
            cached=int(per_state[STATE_CACHED]),
            offloaded=int(per_state[STATE_OFFLOADED]),
            evicted=int(per_state[STATE_EVICTED]),
            tree=int(np.count_nonzero(self.in_tree)),
            references=int(self.holders.sum()),
        )

    def request_holdings(self, request_id: int) -> RequestHoldings:
        pages = self.request_pages.get(request_id, np.zeros(0, np.int64))
        alone = self.holders[pages] == 1
        return RequestHoldings(
            request_id,
            pages,
            private=int(np.count_nonzero(alone)),
            shared=int(np.count_nonzero(~alone)),
            # a page only it holds goes back to the free list unless the tree keeps it
            would_free=int(np.count_nonzero(alone & ~self.in_tree[pages])),
        )

    def owners(self) -> np.ndarray:
        """Legacy owner codes: the holder id of held pages, PAGE_* codes otherwise."""
        return np.where(self.holders > 0, self.holder, _LEGACY_CODE[self.state]).astype(np.int32)

    def invariant_errors(self) -> list[str]:
        """The invariants every step must satisfy; empty when all hold."""
        errors = []
        cached = self.state == STATE_CACHED
        if np.any(cached & ~self.in_tree):
            errors.append("a cached page is not in the prefix tree")
        c = self.counts()
        if c.pool != self.num_pages:
            errors.append(f"used + cached + free = {c.pool} != pool {self.num_pages}")
        held = np.zeros(self.num_pages, np.int64)
        for pages in self.request_pages.values():
            np.add.at(held, pages, 1)
        if not np.array_equal(held, self.holders):
            errors.append("holder counts differ from the requests' page lists")
        if c.private + c.shared != int(np.count_nonzero(self.holders)):
            errors.append("private + distinct shared != pages in use")
        return errors


def step_pages_from(
    step: int,
    num_pages: int,
    request_pages: Mapping[int, Iterable[int]],
    tree: Iterable[int],
    evicted: Mapping[int, str],
) -> StepPages:
    """The one constructor of a step's page states.

    ``request_pages``: every request's held device pages; ``tree``: device pages
    in the prefix tree; ``evicted``: pages evicted this step (and not reloaded
    since) with the last eviction's action (``OFFLOADED_ACTION`` or not).
    O(pages + references), all in numpy.
    """
    lists = {
        int(rid): np.asarray(list(pages) if not isinstance(pages, np.ndarray) else pages, np.int64)
        for rid, pages in request_pages.items()
    }
    lists = {rid: pages for rid, pages in lists.items() if len(pages)}
    holders = np.zeros(num_pages, np.int32)
    holder = np.full(num_pages, np.iinfo(np.int32).max, np.int32)
    for rid, pages in lists.items():
        np.add.at(holders, pages, 1)
        np.minimum.at(holder, pages, rid)
    holder[holders == 0] = -1
    in_tree = np.zeros(num_pages, bool)
    tree_arr = np.fromiter(tree, np.int64) if not isinstance(tree, np.ndarray) else tree
    in_tree[tree_arr.astype(np.int64)] = True
    state = np.full(num_pages, STATE_FREE, np.int8)
    if evicted:
        pages = np.fromiter(evicted.keys(), np.int64, len(evicted))
        off = np.fromiter((a == OFFLOADED_ACTION for a in evicted.values()), bool, len(evicted))
        state[pages] = np.where(off, STATE_OFFLOADED, STATE_EVICTED)
    state[in_tree] = STATE_CACHED
    state[holders == 1] = STATE_PRIVATE
    state[holders >= 2] = STATE_SHARED
    return StepPages(step, state, holders, holder, in_tree, lists)


# --- many pages per cell ----------------------------------------------------------


def _cells(values: np.ndarray, per_cell: int, fill: int) -> np.ndarray:
    """``values`` (pages first) grouped ``per_cell`` at a time: (cells, per_cell, ...)."""
    pad = (-values.shape[0]) % per_cell
    padded = np.concatenate([values, np.full((pad, *values.shape[1:]), fill, values.dtype)])
    return padded.reshape(-1, per_cell, *values.shape[1:])


def cell_mix(state: np.ndarray, per_cell: int) -> np.ndarray:
    """Pages in each state per cell of ``per_cell`` consecutive pages (along the
    first axis of a page vector or a pages x steps matrix): (cells, ..., NUM_STATES)."""
    cells = _cells(state.astype(np.int8), per_cell, _PADDING)
    return np.stack([(cells == k).sum(axis=1) for k in range(NUM_STATES)], axis=-1)


def cell_states(state: np.ndarray, per_cell: int) -> np.ndarray:
    """The dominant state of each cell: most pages, ties to the later state in STATES."""
    if per_cell == 1:
        return state
    mix = cell_mix(state, per_cell)
    return (NUM_STATES - 1 - np.argmax(mix[..., ::-1], axis=-1)).astype(np.int8)


def cell_holders(holders: np.ndarray, per_cell: int) -> np.ndarray:
    """The most holders any page of each cell has (the shade of a shared cell)."""
    if per_cell == 1:
        return holders
    return _cells(holders, per_cell, 0).max(axis=1)


def cell_holder(holder: np.ndarray, per_cell: int) -> np.ndarray:
    """The request a cell is coloured by: the highest holder id among its pages
    (-1 where none is held)."""
    if per_cell == 1:
        return holder
    return _cells(holder, per_cell, -1).max(axis=1)


def cell_any(mask: np.ndarray, per_cell: int) -> np.ndarray:
    """Whether any page of each cell is in ``mask`` (a selected request's pages)."""
    if per_cell == 1:
        return mask
    return _cells(mask, per_cell, False).any(axis=1)


def state_of_owner_codes(owners: np.ndarray) -> np.ndarray:
    """States from legacy owner codes (a snapshot without holder counts: every held
    page reads private, since the codes cannot say who else holds it)."""
    state = np.full(len(owners), STATE_FREE, np.int8)
    state[owners == PAGE_CACHED] = STATE_CACHED
    state[owners == PAGE_OFFLOADED] = STATE_OFFLOADED
    state[owners == PAGE_EVICTED] = STATE_EVICTED
    state[owners >= 0] = STATE_PRIVATE
    return state
