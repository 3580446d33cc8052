"""db.hashmap's compiled maps answer every call the fold makes as a dict would.

Random sequences of those calls (hypothesis) go to the compiled map and to its dict
fallback side by side; every answer and the contents after each call must agree,
ObjectMap's order included. Keys cover what the recorder stores (signed 64-bit
hashes: 0, the extremes, a cluster that collides in the table) and what a general
path may carry (wider ints, strings), which the compiled maps keep in a dict beside
the table."""

from __future__ import annotations

import gc
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.db import hashmap
from kvscope.db.hashmap import DictHashMap, DictObjectMap

INT64 = st.integers(-(2**63), 2**63 - 1)
# few distinct keys so that calls hit what earlier calls put; multiples of 2^40 and
# 0..7 land near each other in a small table (probe runs, shifts on delete)
KEYS = st.one_of(
    st.integers(0, 7),
    st.sampled_from([-(2**63), 2**63 - 1, -1, 2**40, 2**41, 3 * 2**40]),
    INT64,
    st.sampled_from([2**64, 2**70, "a", "b"]),
)
KEY_LISTS = st.lists(KEYS, max_size=40)  # past BULK (32): the prefetched chunks
VALUES = st.integers(-(2**63), 2**63 - 1)

INT_CALLS = st.one_of(
    st.tuples(st.just("set"), KEYS, VALUES),
    st.tuples(st.just("del"), KEYS),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("pop"), KEYS),
    st.tuples(st.just("contains"), KEYS),
    st.tuples(st.just("isdisjoint"), KEY_LISTS),
    st.tuples(st.just("put_all"), KEY_LISTS, VALUES),
    st.tuples(st.just("pop_all"), KEY_LISTS),
    st.tuples(st.just("pop_held"), KEY_LISTS),
    st.tuples(st.just("put_back"), KEY_LISTS),
    st.tuples(st.just("clear")),
)

needs_compiled = pytest.mark.skipif(not hashmap.COMPILED, reason="kvscope.db._hashmap not built")


def test_the_install_built_the_compiled_maps() -> None:
    """make install builds db._hashmap (the pyproject's extension): the fold's fast path."""
    assert hashmap.COMPILED, "kvscope.db._hashmap did not build: pip install -e . with a C compiler"
    assert hashmap.HashMap.__module__ == "kvscope.db._hashmap"


def _call(m, call: tuple):
    op, *args = call
    try:
        if op == "set":
            m[args[0]] = args[1]
            return None
        if op == "del":
            del m[args[0]]
            return None
        if op == "get":
            return m.get(args[0], "none")
        if op == "pop":
            return m.pop(args[0])
        if op == "contains":
            return args[0] in m
        if op == "put_back":  # values popped a moment ago: some None
            keys = args[0]
            values = m.pop_all(keys)
            m.put_back(keys, [v if i % 3 else None for i, v in enumerate(values)])
            return values
        if op == "clear":
            return m.clear()
        return getattr(m, op)(*args)
    except KeyError as e:
        return ("KeyError", e.args)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(INT_CALLS, max_size=60))
def test_hashmap_answers_as_a_dict(calls: list[tuple]) -> None:
    fast, ref = hashmap.HashMap(), DictHashMap()
    for call in calls:
        got, want = _call(fast, call), _call(ref, call)
        if call[0] == "pop_held":  # values of the held keys: the same multiset
            got, want = sorted(got, key=repr), sorted(want, key=repr)
        assert got == want, call
        assert len(fast) == len(ref) and fast == dict(ref), call
    assert sorted(fast.keys(), key=repr) == sorted(ref.keys(), key=repr)
    assert sorted(fast.items(), key=repr) == sorted(ref.items(), key=repr)
    assert sorted(fast, key=repr) == sorted(ref, key=repr)
    assert bool(fast) == bool(ref)


@needs_compiled
def test_hashmap_of_many_keys_through_churn() -> None:
    """Held blocks come and go by the million: every key stays found through deletes
    (the probe runs shifted back) and growth."""
    fast, ref = hashmap.HashMap(), DictHashMap()
    for m in (fast, ref):
        for i in range(200_000):
            m[i * 7919 - 10**6] = i
        for i in range(0, 200_000, 3):
            del m[i * 7919 - 10**6]
        m.put_all(range(10**12, 10**12 + 50_000), 7)
        m.pop_all(range(10**12, 10**12 + 50_000, 2))
    assert len(fast) == len(ref) and fast == dict(ref)
    assert all(fast[k] == v for k, v in ref.items())


OBJ_CALLS = st.one_of(
    st.tuples(st.just("set"), INT64 | st.integers(0, 7), st.integers(0, 3)),
    st.tuples(st.just("del"), st.integers(0, 7)),
    st.tuples(st.just("get"), st.integers(0, 7)),
    st.tuples(st.just("pop"), st.integers(0, 7)),
    st.tuples(st.just("isdisjoint"), st.lists(st.integers(0, 9), max_size=40)),
    st.tuples(st.just("put_all"), st.lists(st.integers(0, 9), max_size=40), st.integers(0, 3)),
    st.tuples(st.just("clear")),
)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(OBJ_CALLS, max_size=80))
def test_object_map_answers_as_a_dict_in_its_order(calls: list[tuple]) -> None:
    fast, ref = hashmap.ObjectMap(), DictObjectMap()
    for call in calls:
        # values are lists, so the map holds references, not ints
        call = tuple([v] if i == 2 else v for i, v in enumerate(call))
        assert _call(fast, call) == _call(ref, call), call
        assert list(fast.items()) == list(ref.items()), call  # insertion order
    assert list(fast) == list(ref) and list(fast.values()) == list(ref.values())


@needs_compiled
def test_object_map_of_many_keys_keeps_order_through_churn_and_compaction() -> None:
    fast, ref = hashmap.ObjectMap(), DictObjectMap()
    for m in (fast, ref):
        for i in range(200_000):
            m[i * 7919] = i
        for i in range(0, 200_000, 3):
            del m[i * 7919]
        m.put_all(range(10**12, 10**12 + 50_000), "x")  # growth over holes: compaction
        for i in range(1, 60_000, 3):
            m[i * 7919] = -i  # replaced in place: the position stays
    assert len(fast) == len(ref) and list(fast.items()) == list(ref.items())
    assert fast.isdisjoint([0, 3 * 7919]) and not fast.isdisjoint([0, 7919])


@needs_compiled
def test_object_map_under_fifo_churn_compacts_and_keeps_order() -> None:
    """A pruned tree's pattern: new keys appended, the oldest deleted, so the entries
    fill with holes and are compacted again and again; nothing found moves or is lost."""
    fast, ref = hashmap.ObjectMap(), DictObjectMap()
    for m in (fast, ref):
        m.put_all(range(1000), "old")
        for i in range(1000, 60_000):
            m[i] = i
            m.pop(i - 1000 + (i % 7 == 0) * 500, None)  # mostly the oldest, some younger
    assert len(fast) == len(ref) and list(fast.items()) == list(ref.items())
    # bounded by the living (11-21 B of index, at most 32 B of entries a key), not by
    # the 60k ever put
    assert sys.getsizeof(fast) <= 56 * len(fast) + 4096


@needs_compiled
def test_object_map_iteration_refuses_a_map_moved_under_it() -> None:
    m = hashmap.ObjectMap()
    m.put_all(range(8), None)
    it = iter(m)
    next(it)
    m.put_all(range(100, 200), None)  # grown: entries moved
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        next(it)


@needs_compiled
def test_object_map_releases_its_values() -> None:
    value = object()
    m = hashmap.ObjectMap()
    base = sys.getrefcount(value)
    m.put_all(list(range(1000)), value)
    m[5] = value
    assert sys.getrefcount(value) == base + 1000
    for k in range(500):
        del m[k]
    m.pop(600)
    assert sys.getrefcount(value) == base + 499
    m.clear()
    assert sys.getrefcount(value) == base
    m.put_all([1, 2], value)
    del m
    gc.collect()
    assert sys.getrefcount(value) == base


@needs_compiled
def test_values_must_be_64_bit_ints_and_keys_any_hashable() -> None:
    m = hashmap.HashMap()
    with pytest.raises(TypeError, match="64-bit ints"):
        m[1] = "x"
    with pytest.raises(TypeError, match="64-bit ints"):
        m.put_all([1], 2**64)
    with pytest.raises(TypeError):  # unhashable, as a dict says
        m[[1]] = 1
    m[2**64] = 1
    m["k"] = 2
    assert (m[2**64], m["k"], len(m)) == (1, 2, 2)


@needs_compiled
def test_held_blocks_take_a_fraction_of_a_dicts_memory() -> None:
    keys = [(i * 0x9E3779B97F4A7C15) % 2**63 for i in range(1, 200_001)]
    m = hashmap.HashMap()
    m.put_all(keys, 123456789012)
    # 16-byte slots at a load of 3/8 to 3/4: at most 43 bytes a key, the keys'
    # int objects not kept (a dict holds them: 24-byte entries and 32-byte ints)
    assert sys.getsizeof(m) / len(m) <= 43
    assert m.isdisjoint([k + 1 for k in keys[:100]]) and not m.isdisjoint(keys[-1:])
