"""Reads of page occupancy: snapshots, the heatmap matrix, the page map at any step.

Page maps are stored every few steps (``page_maps``); ``owners_at`` brings the
snapshot at or before a position forward through the page events of the steps
since, so a replay shows every step exactly. ``page_accounting`` replays the
allocation events against the snapshots as a consistency check.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

import numpy as np

from kvscope.db.page_states import (
    PAGE_OFFLOADED,
)
from kvscope.db.source import Source, connection, run_origin, window
from kvscope.engine.events import (
    PAGE_CACHED,
    PAGE_EVICTED,
    PAGE_FREE,
    PagesAllocated,
    PagesFreed,
)

# Page classes in the order ties between them are broken (the last wins): an
# aggregated cell shows the class most of its pages are in.
PAGE_CLASSES = ("free", "cached", "offloaded", "evicted", "request")

_CLASS_CODES = np.array([PAGE_FREE, PAGE_CACHED, PAGE_OFFLOADED, PAGE_EVICTED, 0], dtype=np.int32)

_PADDING = -99  # fills the last cell; in no class

# Class of each page code (-code), for page_classes.
_CLASS_OF_CODE = np.zeros(-_PADDING + 1, dtype=np.int8)

_CLASS_OF_CODE[[-PAGE_CACHED, -PAGE_OFFLOADED, -PAGE_EVICTED, -_PADDING]] = [1, 2, 3, -1]


def page_classes(owners: np.ndarray) -> np.ndarray:
    """Index into PAGE_CLASSES of every page (-1 for padding)."""
    codes = _CLASS_OF_CODE[np.clip(-owners, 0, -_PADDING)]
    return np.where(owners >= 0, np.int8(4), codes)


def _cells(owners: np.ndarray, per_cell: int) -> np.ndarray:
    """``owners`` (pages first) grouped ``per_cell`` pages at a time: (cells, per_cell, ...)."""
    pad = (-owners.shape[0]) % per_cell
    padded = np.concatenate([owners, np.full((pad, *owners.shape[1:]), _PADDING, np.int32)])
    return padded.reshape(-1, per_cell, *owners.shape[1:])


def class_counts(owners: np.ndarray, per_cell: int) -> np.ndarray:
    """Pages of each PAGE_CLASSES class in each cell of ``per_cell`` consecutive
    pages: shape (cells, ..., len(PAGE_CLASSES)); every page is counted once."""
    classes = page_classes(_cells(owners, per_cell))
    return np.stack([(classes == k).sum(axis=1) for k in range(len(PAGE_CLASSES))], axis=-1)


def dominant_owners(owners: np.ndarray, per_cell: int) -> np.ndarray:
    """The owner each cell of ``per_cell`` consecutive pages shows (along the first
    axis of a 1-D page map or a pages x snapshots matrix): the class most of its
    pages are in (ties to requests, then evicted, offloaded, cached, free), and
    for requests the highest request id among them."""
    if per_cell == 1:
        return owners
    counts = class_counts(owners, per_cell)
    best = len(PAGE_CLASSES) - 1 - np.argmax(counts[..., ::-1], axis=-1)
    requests = _cells(owners, per_cell).max(axis=1)  # codes are negative: a request id if any
    return np.where(best == len(PAGE_CLASSES) - 1, requests, _CLASS_CODES[best]).astype(np.int32)


@dataclass(frozen=True, slots=True)
class PageSnapshot:
    step: int
    t_s: float
    owners: np.ndarray  # int32: request id >= 0, or engine.events.PAGE_* codes
    pages_owned: int
    pages_cached: int
    pages_free: int
    pages_evicted: int


@dataclass(frozen=True, slots=True)
class PageMatrix:
    """Page owners over time for a heatmap: ``owners[page_row, snapshot]``."""

    steps: list[int]
    t_s: list[float]
    owners: np.ndarray  # int32, shape (ceil(pages / page_stride), len(steps))
    page_stride: int  # row i shows pages [i * page_stride, (i + 1) * page_stride)


@dataclass(frozen=True, slots=True)
class PageBalance:
    """The page events replayed up to one snapshot, beside the snapshot itself."""

    step: int
    t_s: float
    allocated: int  # page references handed out so far (a shared prefix page once per request)
    freed: int  # page references given back so far
    referenced: int  # distinct pages with references left: must equal ``owned``
    owned: int  # pages with an owner in the snapshot


def decode_owners(blob: bytes) -> np.ndarray:
    """A stored page map back to its int32 owners array."""
    return np.frombuffer(zlib.decompress(blob), dtype="<i4").astype(np.int32)


def page_map_at(source: Source, run_id: int, step: int) -> PageSnapshot | None:
    """The page-map snapshot nearest at or before ``step`` (the last one taken at
    that step), or None if there is none that early."""
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        row = conn.execute(
            """SELECT step, ts_ns, owners, pages_owned, pages_cached, pages_free, pages_evicted
               FROM page_maps WHERE run_id = ? AND step <= ?
               ORDER BY step DESC, id DESC LIMIT 1""",
            (run_id, step),
        ).fetchone()
    if row is None:
        return None
    step, ts_ns, blob, owned, cached, free, evicted = row
    return PageSnapshot(
        step, (ts_ns - start_ns) / 1e9, decode_owners(blob), owned, cached, free, evicted
    )


def page_maps(
    source: Source,
    run_id: int,
    max_snapshots: int = 200,
    max_pages: int | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
) -> PageMatrix:
    """Page owners across snapshots, for a pages x time heatmap.

    At most ``max_snapshots`` snapshots, evenly spaced over the window; with
    ``max_pages``, at most that many rows, each aggregating ``page_stride``
    consecutive pages (``dominant_owners``). Pages missing from a smaller
    snapshot read as PAGE_FREE.
    """
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        lo, hi = window(start_ns, since_s, until_s)
        index = conn.execute(
            """SELECT id, step, ts_ns FROM page_maps WHERE run_id = ? AND ts_ns BETWEEN ? AND ?
               ORDER BY step, id""",
            (run_id, lo, hi),
        ).fetchall()
        if len(index) > max_snapshots:
            picks = np.unique(np.linspace(0, len(index) - 1, max_snapshots).round().astype(int))
            index = [index[i] for i in picks]
        blobs = dict(
            conn.execute(
                f"SELECT id, owners FROM page_maps WHERE id IN ({','.join('?' * len(index))})",
                [row[0] for row in index],
            ).fetchall()
        )
    columns = [decode_owners(blobs[row[0]]) for row in index]
    num_pages = max((len(c) for c in columns), default=0)
    stride = max(1, -(-num_pages // max_pages)) if max_pages else 1
    owners = np.full((num_pages, len(columns)), PAGE_FREE, dtype=np.int32)
    for j, column in enumerate(columns):
        owners[: len(column), j] = column
    return PageMatrix(
        steps=[row[1] for row in index],
        t_s=[(row[2] - start_ns) / 1e9 for row in index],
        owners=dominant_owners(owners, stride),
        page_stride=stride,
    )


def page_accounting(source: Source, run_id: int) -> list[PageBalance]:
    """PagesAllocated / PagesFreed replayed in time order, checked at every snapshot.

    A page shared by several requests (a prefix hit) is allocated once per
    request and freed once per request; it is in use while any reference is
    left. ``referenced == owned`` at every snapshot says the event stream and
    the page maps tell the same story (without sharing, ``allocated - freed``
    equals ``owned`` too).
    """
    with connection(source) as conn:
        start_ns = run_origin(conn, run_id)
        snapshots = conn.execute(
            "SELECT step, ts_ns, pages_owned FROM page_maps WHERE run_id = ? ORDER BY ts_ns, id",
            (run_id,),
        ).fetchall()
        changes = conn.execute(
            """SELECT ts_ns, kind = ?, payload FROM events
               WHERE run_id = ? AND kind IN (?, ?) ORDER BY ts_ns, id""",
            (PagesAllocated.kind, run_id, PagesAllocated.kind, PagesFreed.kind),
        ).fetchall()
    refs: dict[int, int] = {}
    allocated = freed = referenced = 0
    balances = []
    i = 0
    for step, ts_ns, owned in snapshots:
        while i < len(changes) and changes[i][0] <= ts_ns:
            _, is_alloc, payload = changes[i]
            pages = json.loads(payload)["pages"]
            for page in pages:
                before = refs.get(page, 0)
                after = before + (1 if is_alloc else -1)
                refs[page] = after
                referenced += (after > 0) - (before > 0)
            if is_alloc:
                allocated += len(pages)
            else:
                freed += len(pages)
            i += 1
        balances.append(
            PageBalance(step, (ts_ns - start_ns) / 1e9, allocated, freed, referenced, owned)
        )
    return balances
