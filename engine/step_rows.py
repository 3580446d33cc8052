"""A step's metadata as host values, before staging: each row's tokens, positions and
slots, and the CSR page table (``kv_indptr``/``kv_indices``) of its requests' pages.
``DecodeTable`` keeps a decode batch's table across steps, inserting new pages and
dropping finished rows, instead of rebuilding it every step."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from kvscope.engine.request import Request


@dataclass(slots=True)
class StepRows:
    """A step's inputs as host values, before staging."""

    tokens: list[int]
    positions: object  # list or int64 array, one per token
    slots: object
    flat: list[int]  # the CSR page table: every request's pages, concatenated
    indptr: object
    last: object  # tokens in each request's last page
    kv_lens: list[int]
    rows: list[int]  # logits rows, in sampling order
    sampling: list[Request]
    cu: object = None  # cu_seqlens_q (chunked steps)


class DecodeTable:
    """The CSR page table (kv_indptr / kv_indices) of the last decode step, kept for the next.

    While requests keep decoding, their page lists only grow at the end
    (``KVCacheManager.grow`` extends the list in place), so the next step's table is
    this one with the rows of finished (or preempted) requests dropped and the few new
    pages inserted in place, instead of every request's pages sliced and concatenated
    again. A request it does not hold (the first decode after admission), a replaced
    page list (swap-in, a prefix match) or a shrunk one rebuilds it; so does every step
    that is not a plain decode. The page ids live in a C-int ``array``: staging copies
    it into its buffer at memcpy speed (0.5 us for 2,200 ids, where a list of Python
    ints took 27 us), and inserts are memmoves; numpy, whose per-call cost is paid cold
    after every forward, measured slower than the list work it replaced.
    """

    __slots__ = ("requests", "page_lists", "counts", "flat", "indptr", "rebuilds", "updates")

    def __init__(self) -> None:
        self.requests: list = []
        self.page_lists: list[list[int]] = []
        self.counts: list[int] = []  # pages in the table per request
        self.flat = array("i")
        self.indptr = array("i", [0])
        self.rebuilds = 0  # steps that built the table from every page list
        self.updates = 0  # steps that kept it, dropping rows and inserting new pages

    def clear(self) -> None:
        self.requests = []
        self.page_lists = []

    def update(
        self, requests: list, counts: list[int], kept: list[int], grew: list[int]
    ) -> tuple[array, array]:
        """The table for ``requests``: row i is old row ``kept[i]`` (increasing), grown
        to ``counts[i]`` pages; rows ``grew`` have pages to insert."""
        old, flat, ends = self.counts, self.flat, self.indptr
        changed = bool(grew)
        if len(kept) < len(old):  # some requests left: drop their rows
            flat = array("i")
            for j in kept:
                flat += self.flat[ends[j] : ends[j + 1]]
            old = [old[j] for j in kept]
            ends = array("i", accumulate(old, initial=0))
            self.page_lists = [self.page_lists[j] for j in kept]
            self.requests = list(requests)
            self.flat = flat
            changed = True
        for i in reversed(grew):  # from the end, so the earlier rows' offsets hold
            end = ends[i + 1]
            flat[end:end] = array("i", self.page_lists[i][old[i] : counts[i]])
        if changed:
            self.indptr = array("i", accumulate(counts, initial=0))
        self.counts = counts
        self.updates += 1
        return flat, self.indptr

    def rebuild(self, requests: list, counts: list[int]) -> tuple[array, array]:
        """A table of each request's first ``counts[i]`` pages, kept for the next step."""
        page_lists = [req.pages for req in requests]
        flat: list[int] = []
        for pages, c in zip(page_lists, counts, strict=True):
            flat += pages[:c]
        self.flat = array("i", flat)
        self.indptr = array("i", accumulate(counts, initial=0))
        self.requests = list(requests)
        self.page_lists = page_lists
        self.counts = counts
        self.rebuilds += 1
        return self.flat, self.indptr


def decode_rows(
    requests: list, ps: int, all_logits: bool, table: DecodeTable | None = None
) -> StepRows:
    """A step of one new token per request, in plain Python: at decode batch sizes that is
    faster than a dozen array operations on tiny arrays. A row whose position is past the
    request's known tokens is fed its token by the step in flight (async scheduling):
    staged as 0, and it samples. ``table`` keeps the page table from the last decode
    step (None: built afresh)."""
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    last: list[int] = []
    kv_lens: list[int] = []
    counts: list[int] = []
    rows: list[int] = []
    sampling: list[Request] = []
    if table is None:
        table = DecodeTable()
    # Each request is matched to its row in the kept table: the old rows in order,
    # skipping those whose requests left (finished or preempted since).
    held, lists, old = table.requests, table.page_lists, table.counts
    m = len(held)
    kept: list[int] | None = []
    grew: list[int] = []
    j = 0
    for i, req in enumerate(requests):
        pos = req.num_computed
        pages = req.pages
        k, off = divmod(pos, ps)
        positions.append(pos)
        slots.append(pages[k] * ps + off)
        last.append(off + 1)
        kv_lens.append(pos + 1)
        counts.append(k + 1)
        if kept is not None:
            while j < m and held[j] is not req:
                j += 1
            if j == m or pages is not lists[j] or k + 1 < old[j]:
                kept = None
            else:
                kept.append(j)
                if k + 1 != old[j]:
                    grew.append(i)
                j += 1
        prompt = req.prompt_ids
        p = len(prompt)
        n = p + len(req.output_ids)
        if pos == n:  # fed from the device
            tokens.append(0)
        else:
            tokens.append(prompt[pos] if pos < p else req.output_ids[pos - p])
            if not (all_logits or pos + 1 == n):
                continue
        rows.append(i)
        sampling.append(req)
    if kept is None:
        flat, indptr = table.rebuild(requests, counts)
    else:
        flat, indptr = table.update(requests, counts, kept, grew)
    return StepRows(tokens, positions, slots, flat, indptr, last, kv_lens, rows, sampling)


def chunk_rows(requests: list, num_new: list[int], ps: int, all_logits: bool) -> StepRows:
    """A step with chunks of several tokens: per-token values as array operations."""
    tokens: list[int] = []
    flat: list[int] = []
    indptr = [0]
    kv_lens: list[int] = []
    rows: list[int] = []
    sampling: list[Request] = []
    for req, n in zip(requests, num_new, strict=True):
        start = req.num_computed
        end = start + n
        known = req.num_tokens
        if start == known:  # a decode fed from the device (async scheduling): staged as 0
            tokens.append(0)
        else:
            tokens.extend(sequence_tokens(req, start, end))
        flat.extend(req.pages[: -(-end // ps)])
        indptr.append(len(flat))
        kv_lens.append(end)
        samples = end >= known  # its last known token, or the fed one
        if all_logits:
            rows.extend(range(len(tokens) - n, len(tokens)))
        elif samples:
            rows.append(len(tokens) - 1)
        if all_logits or samples:
            sampling.append(req)
    b, t = len(requests), len(tokens)
    ends = np.asarray(kv_lens, dtype=np.int64)
    ptr = np.asarray(indptr, dtype=np.int64)
    counts = np.asarray(num_new, dtype=np.int64)
    cu = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(counts, out=cu[1:])
    positions = np.arange(t, dtype=np.int64) + np.repeat(ends - counts - cu[:-1], counts)
    page_of = np.asarray(flat, dtype=np.int64)[np.repeat(ptr[:-1], counts) + positions // ps]
    last = ends - (ptr[1:] - ptr[:-1] - 1) * ps
    return StepRows(
        tokens, positions, page_of * ps + positions % ps, flat, ptr, last, kv_lens, rows,
        sampling, cu,
    )  # fmt: skip


def sequence_tokens(req: Request, start: int, end: int) -> list[int]:
    """Tokens ``start:end`` of the request's sequence (prompt then output), without
    concatenating the two (``req.token_ids()`` copies the whole sequence)."""
    prompt = req.prompt_ids
    p = len(prompt)
    if end <= p:
        return prompt[start:end]
    if start >= p:
        return req.output_ids[start - p : end - p]
    return prompt[start:] + req.output_ids[: end - p]
