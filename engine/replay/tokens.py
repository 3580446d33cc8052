"""Token content known page by page: how a trace's hash ids become pages the radix cache keys.

A production trace gives each request a list of block hash ids, not tokens. The
replay turns every page of ``page_size`` tokens into one integer key derived
from the ids it covers (equal ids give equal keys, different ids never collide,
see ``KeySpace``), and hands the radix cache a ``PageTokens``: a sequence with a
length and ``page_keys(start, stop)``, so a lookup costs one dict probe per page
and no Python work per token. Pages that hold output tokens are new content
nobody else can have, so each gets a fresh key.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import count

NEVER = 1 << 62  # next use of content no later request needs


class KeySpace:
    """Interns page contents (tuples of block pieces or token ids) as small ints.

    Positive ints are contents seen in the trace; ``fresh()`` hands out negative
    ints for content that exists once (output pages, blocks a line left
    unnamed), so the two never collide.
    """

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self._fresh = count(-1, -1)

    def key(self, content: Hashable) -> int:
        ids = self._ids
        k = ids.get(content)
        if k is None:
            k = ids[content] = len(ids) + 1
        return k

    def fresh(self) -> int:
        return next(self._fresh)

    def __len__(self) -> int:
        return len(self._ids)


class PageTokens:
    """``length`` tokens whose full pages of the prompt have the keys ``keys``.

    Supports what the engine asks of a request's tokens: ``len``, prefix slices
    (``tokens[:n]``) and ``+ output_ids`` (the output only lengthens it). Page
    ``i`` at or past ``len(keys)`` holds output tokens: its key comes from
    ``tail``, the request's own fresh keys, made on first use; with ``tail`` None
    they have no key, and the radix cache stores only the prompt's pages.
    """

    __slots__ = ("keys", "length", "uses", "tail", "space", "token_ids")

    def __init__(
        self,
        keys: list[int],
        length: int,
        space: KeySpace,
        uses: list[int] | None = None,
        tail: list[int] | None = None,
        token_ids: list[int] | None = None,
    ) -> None:
        self.keys = keys
        self.length = length
        self.space = space
        self.uses = uses  # next use of each page's content (belady), aligned with keys
        self.tail = tail  # the output pages' keys, shared by every view of one request
        # A token trace's prompt ids: only the miss reasons read them (granularity:
        # content shared inside a page, engine/miss_reasons.py); hash-id traces have none.
        self.token_ids = token_ids

    def __len__(self) -> int:
        return self.length

    def _view(self, length: int) -> PageTokens:
        return PageTokens(self.keys, length, self.space, self.uses, self.tail, self.token_ids)

    def __add__(self, other: list[int]) -> PageTokens:
        return self._view(self.length + len(other)) if other else self

    def __getitem__(self, index: slice) -> PageTokens:
        if not isinstance(index, slice) or index.start not in (None, 0) or index.step is not None:
            raise TypeError("page-keyed tokens support prefix slices only")
        stop = self.length if index.stop is None else max(0, min(index.stop, self.length))
        return self._view(stop)

    def page_keys(self, start: int, stop: int) -> list[int]:
        """Keys of pages ``start`` to ``stop - 1`` (only the prompt's when ``tail`` is None:
        output pages are then never cached)."""
        n = len(self.keys)
        if stop <= n or self.tail is None:
            return self.keys[start:stop]
        tail = self.tail
        while len(tail) < stop - n:
            tail.append(self.space.fresh())
        return self.keys[start:] + tail[max(0, start - n) : stop - n]

    def next_use(self, page: int) -> int:
        uses = self.uses
        return uses[page] if uses is not None and page < len(uses) else NEVER
