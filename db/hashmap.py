"""Block hash maps for the watch fold: compiled where the install built it.

Folding a fleet's stream is mostly dict work on a few maps of 0.5-2M block hashes
(each source's held blocks, its remembered removals), and there a Python dict costs
110-140 bytes and two or three cache misses an operation. ``db/_hashmap.c`` keeps
key and value inline in 16-byte slots and prefetches a whole event's slots at once.

``HashMap`` maps a hash to an int (held blocks, remembered removals), unordered;
``ObjectMap`` maps it to any object in insertion order, as a dict does (the prefix
tree's nodes, whose oldest leaves are pruned first), with ``isdisjoint`` and
``put_all`` as below, and ``keys``/``values``/``items`` as iterators.

Each compiled type and its fallback answer the same calls, those the fold makes: a dict's
``len``, ``in``, ``[]``, ``get``, ``pop``, ``del``, ``clear``, ``keys``/``values``/
``items`` (lists) and iteration, plus a call per event for what would be one per
block: ``isdisjoint(keys)``, ``put_all(keys, value)`` (how many were new),
``pop_all(keys)`` (each value or None), ``pop_held(keys)`` (values of those held)
and ``put_back(keys, values)`` (where a value is not None). Iteration order is
not insertion order in the compiled map: the fold relies on none.

``COMPILED`` says which one this install has; the pyproject builds the extension
as optional, so a machine without a C compiler still installs, with dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat


class DictHashMap(dict):
    """The same calls on a dict: the fallback, and the tests' reference."""

    __slots__ = ()

    def isdisjoint(self, keys: Iterable) -> bool:
        return dict.keys(self).isdisjoint(keys)

    def put_all(self, keys: Sequence, value: int) -> int:
        before = len(self)
        self.update(zip(keys, repeat(value)))
        return len(self) - before

    def pop_all(self, keys: Sequence) -> list:
        return list(map(self.pop, keys, repeat(None)))

    def pop_held(self, keys: Sequence) -> list:
        pop = self.pop
        return [v for v in map(pop, keys, repeat(None)) if v is not None]

    def put_back(self, keys: Sequence, values: Sequence) -> None:
        self.update((k, v) for k, v in zip(keys, values, strict=True) if v is not None)

    def keys(self) -> list:  # type: ignore[override]
        return list(dict.keys(self))

    def values(self) -> list:  # type: ignore[override]
        return list(dict.values(self))

    def items(self) -> list:  # type: ignore[override]
        return list(dict.items(self))


class DictObjectMap(dict):
    """``ObjectMap``'s calls on a dict (insertion-ordered too): the fallback."""

    __slots__ = ()

    def isdisjoint(self, keys: Iterable) -> bool:
        return self.keys().isdisjoint(keys)

    def put_all(self, keys: Sequence, value: object) -> int:
        before = len(self)
        self.update(zip(keys, repeat(value)))
        return len(self) - before


try:
    from kvscope.db._hashmap import HashMap, ObjectMap

    COMPILED = True
except ImportError:  # built without a compiler (the extension is optional)
    HashMap = DictHashMap  # type: ignore[misc,assignment]
    ObjectMap = DictObjectMap  # type: ignore[misc,assignment]
    COMPILED = False
