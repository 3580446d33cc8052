"""Page pool invariants under random allocate / share / release sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.engine.page_pool import OutOfPages, PagePool


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["alloc", "share", "free"]), st.integers(0, 7)), max_size=80)
)
def test_pool_accounting(ops):
    pool = PagePool(16, 4)
    holders: list[list[int]] = []
    for op, n in ops:
        if op == "alloc":
            if n > pool.num_free:
                with pytest.raises(OutOfPages):
                    pool.allocate(n)
            else:
                holders.append(pool.allocate(n))
        elif op == "share" and holders:
            pages = holders[n % len(holders)]
            pool.incref(pages)
            holders.append(list(pages))
        elif op == "free" and holders:
            pool.decref(holders.pop(n % len(holders)))
        pool.check_integrity()
        held = {p for h in holders for p in h}
        assert pool.num_used == len(held)
        assert all(pool.refcount[p] == sum(h.count(p) for h in holders) for p in range(16))
    for h in holders:
        pool.decref(h)
    pool.check_integrity()
    assert pool.num_free == 16


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda pool: pool.refcount.__setitem__(3, 0), "page 3: refcount 0, free=False"),
        (lambda pool: pool.refcount.__setitem__(9, 1), "page 9: refcount 1, free=True"),
        (lambda pool: pool._free.append(9), "page twice in the free list"),
        (lambda pool: pool.refcount.__setitem__(2, -1), "negative refcount on page 2"),
    ],
)
def test_check_integrity_names_the_broken_page(corrupt, message):
    pool = PagePool(16, 4)
    pool.allocate(4)  # pages 0..3 held, 4..15 free
    pool.check_integrity()
    corrupt(pool)
    with pytest.raises(AssertionError, match=message):
        pool.check_integrity()
