"""Why each prompt token missed the prefix cache: cold, capacity, granularity or last token.

A hit rate alone cannot tell "no shared prefix" from "shared, but evicted" or
"shared, but shorter than a page". At every admission the KV-cache manager
splits the tokens the prefix cache did not serve into four reasons:

- *capacity*: the page's content (its whole prefix, as a chained page hash)
  had been cached and was evicted before this use: more KV memory would have
  saved it. The time (and steps) since its eviction are kept.
- *granularity*: content shared with an earlier sequence, but shorter than a
  page (the page where two sequences diverge, or the partial last page): only
  a smaller page would have saved it.
- *last token*: the one token the rule always computes (a lookup covers all
  prompt tokens but the last, as in vLLM).
- *cold*: the rest: content first seen here (or not cached yet).

The live engine and ``kvscope replay`` share this code: it sits in the
engine's prefix-cache path (``KVCacheManager.admitted``, fed by the
``RadixCache``'s evictions).

Cost per admission is O(missed pages) dict operations and no Python work per
token: the hit pages are not touched (the radix node of the last hit page
carries its chain hash); a missed page's key is a tuple slice of the tokens
(C-level copying and hashing), or a replay's integer page key; past the first
cold page only token content is still remembered, for later granularity (a
hash-id replay's page keys stop the walk there).

Memory is bounded twice: at most ``max_evicted`` chain hashes of evicted pages
(measured at about 124 B each: 2^19 of them, the default, 65 MB at worst; the
oldest forgotten first, a forgotten page then counting as cold; the whole
Mooncake conversation trace needs 171k), and at most ``max_seen_tokens`` tokens
of page content kept for granularity (int64 bytes, ``max_children`` pages per
parent prefix, the oldest prefixes forgotten first: 2^20 tokens, the default,
measured at about 21 B a token at page size 16, 22 MB; 60 B a token at page 4).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

ROOT_CHAIN = 0  # the chain hash of the empty prefix


def chain_hash(parent: int, key: tuple[int, ...]) -> int:
    """The hash of a page's whole prefix: its parent's chain hash and its own tokens."""
    return hash((parent, key))


@dataclass(slots=True)
class MissSplit:
    """Missed tokens by reason, for one admission or summed over many."""

    cold: int = 0
    capacity: int = 0
    granularity: int = 0
    last_token: int = 0
    capacity_pages: int = 0
    capacity_age_s: float = 0.0  # summed over capacity pages: time since each was evicted
    capacity_age_steps: int = 0  # summed likewise, in engine steps

    @property
    def missed(self) -> int:
        return self.cold + self.capacity + self.granularity + self.last_token

    def add(self, other: MissSplit) -> None:
        self.cold += other.cold
        self.capacity += other.capacity
        self.granularity += other.granularity
        self.last_token += other.last_token
        self.capacity_pages += other.capacity_pages
        self.capacity_age_s += other.capacity_age_s
        self.capacity_age_steps += other.capacity_age_steps


_STEP_BITS = 32  # an eviction is stored as one int: its ns << 32 | its step (mod 2^32)
_STEP_MASK = (1 << _STEP_BITS) - 1
_TOKEN = 8  # bytes per token of remembered content (int64: any id a trace gives)


def page_bytes(tokens: tuple[int, ...]) -> bytes:
    """A page's tokens as remembered: int64 bytes (a tuple of ints costs ~36 B a token)."""
    return array("q", tokens).tobytes()


def shared_length(a: bytes, b: bytes) -> int:
    """Tokens in the common prefix of two remembered pages (binary search over C-level
    slice compares)."""
    lo, hi = 0, min(len(a), len(b)) // _TOKEN
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: mid * _TOKEN] == b[: mid * _TOKEN]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class MissReasons:
    """Remembers evicted and seen page content (bounded) and classifies each admission."""

    def __init__(
        self,
        page_size: int,
        *,
        granularity: bool = True,
        max_evicted: int = 1 << 19,
        max_seen_tokens: int = 1 << 20,
        max_children: int = 8,
    ) -> None:
        self.page_size = page_size
        self.granularity = granularity
        self.max_evicted = max_evicted
        self.max_seen_tokens = max_seen_tokens
        self.max_children = max_children
        # chain hash -> its latest eviction (monotonic ns << 32 | step); dict order: first eviction.
        self._evicted: dict[int, int] = {}
        # parent chain hash -> the tokens of the child pages seen under it (partial pages too),
        # oldest first: a list (a dict per parent would cost ~150 B more a page).
        self._seen: dict[int, list[bytes]] = {}
        self._seen_tokens = 0

    # --- fed by the radix cache ------------------------------------------------------

    def evicted(self, chain: int, ts_ns: int, step: int) -> None:
        """A page with this chain hash left the cache (dropped, not offloaded)."""
        evicted = self._evicted
        # A re-evicted page keeps its place in the order (a pop to move it costs ~10% of
        # a replay's eviction time): the bound forgets by first eviction.
        evicted[chain] = ts_ns << _STEP_BITS | step & _STEP_MASK
        if len(evicted) > self.max_evicted:
            del evicted[next(iter(evicted))]

    # --- at admission -------------------------------------------------------------------

    def classify(
        self,
        keys: Iterable[Hashable],
        num_tokens: int,
        hit_pages: int,
        parent: int,
        tail: tuple[int, ...] | None,
        ts_ns: int,
        step: int,
        token_ids: Sequence[int] | None = None,
    ) -> MissSplit:
        """Split the ``num_tokens - hit_pages * page_size`` missed tokens of one admission.

        ``keys`` are the radix keys of the full pages the lookup covers, from the
        first missed page on: token tuples (whose content granularity compares)
        or a replay's opaque page keys (compared through ``token_ids`` when the
        replay has them; else no granularity). ``parent`` is the chain
        hash of the last hit page (``ROOT_CHAIN`` with no hit); ``tail`` the
        tokens of the page the lookup reaches into partially, last token
        included (None when the lookup ends on a page boundary or tokens are
        not known). The pages are remembered for later admissions.
        """
        ps = self.page_size
        limit = num_tokens - 1  # the lookup's reach: the last token is always computed
        remember = self.granularity
        evicted = self._evicted.get
        cold = granularity = capacity_pages = age_ns = age_steps = 0
        diverged = False  # past the first cold page nothing was ever cached
        chain, j = parent, hit_pages
        for key in keys:
            if type(key) is tuple:
                page = key
            elif token_ids is not None:
                page = tuple(token_ids[j * ps : (j + 1) * ps])
            else:
                page = None
            tokens = page is not None
            if diverged and not (tokens and remember):
                break  # nothing to remember: the rest is cold
            child = hash((chain, key))  # chain_hash, inlined: this loop is the hot path
            when = None if diverged else evicted(child)
            if when is not None:
                capacity_pages += 1
                age_ns += ts_ns - (when >> _STEP_BITS)
                age_steps += (step - when) & _STEP_MASK
            elif diverged:
                cold += ps
            else:
                shared = self._shared(chain, page) if tokens else 0
                granularity += shared
                cold += ps - shared
                diverged = True
            if tokens and remember:
                self._remember(chain, page)  # later requests may diverge inside it
            chain, j = child, j + 1
        covered = j * ps
        if tail is not None and covered + len(tail) - 1 == limit:  # the loop reached the tail
            rest = len(tail) - 1
            shared = 0 if diverged else min(rest, self._shared(chain, tail))
            granularity += shared
            cold += rest - shared
            self._remember(chain, tail)
        else:
            cold += limit - covered
        return MissSplit(
            cold,
            capacity_pages * ps,
            granularity,
            1 if num_tokens else 0,
            capacity_pages,
            age_ns / 1e9,
            age_steps,
        )

    def _shared(self, parent: int, key: tuple[int, ...]) -> int:
        children = self._seen.get(parent)
        if not children:
            return 0
        mine = page_bytes(key)
        return max(shared_length(mine, seen) for seen in children)

    def _remember(self, parent: int, key: tuple[int, ...]) -> None:
        if not self.granularity:
            return
        seen = self._seen
        page = page_bytes(key)
        children = seen.get(parent)
        if children is None:
            seen[parent] = children = []
        elif page in children:
            return
        if len(children) >= self.max_children:
            self._seen_tokens -= len(children.pop(0)) // _TOKEN
        children.append(page)
        self._seen_tokens += len(key)
        while self._seen_tokens > self.max_seen_tokens and seen:
            oldest = next(iter(seen))
            self._seen_tokens -= sum(map(len, seen.pop(oldest))) // _TOKEN

    @property
    def remembered(self) -> tuple[int, int]:
        """(evicted chain hashes, seen tokens) held now: the bounded memory, for tests."""
        return len(self._evicted), self._seen_tokens


__all__ = ["ROOT_CHAIN", "MissReasons", "MissSplit", "chain_hash", "page_bytes", "shared_length"]
