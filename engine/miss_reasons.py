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

Cost per admission is O(missed pages) dict operations, none per token: the
hit pages are not touched (the radix node of the last hit page carries its
chain hash); a page's key is the tuple the radix cache builds anyway (or a
replay's integer page key), and past the first cold page only token content
is still remembered (a replay's page keys stop the walk there). Memory is bounded twice: at most ``max_evicted`` chain
hashes of evicted pages (oldest forgotten first; a forgotten page then counts
as cold), and at most ``max_seen_tokens`` tokens of page content kept for
granularity (``max_children`` contents per parent prefix; oldest prefixes
forgotten first).
"""

from __future__ import annotations

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


def shared_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix of two pages (binary search over C-level slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
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
        max_evicted: int = 1 << 20,
        max_seen_tokens: int = 1 << 21,
        max_children: int = 8,
    ) -> None:
        self.page_size = page_size
        self.granularity = granularity
        self.max_evicted = max_evicted
        self.max_seen_tokens = max_seen_tokens
        self.max_children = max_children
        # chain hash -> (monotonic ns, step) of its latest eviction; dict order: first eviction.
        self._evicted: dict[int, tuple[int, int]] = {}
        # parent chain hash -> {child chain hash: the child page's tokens (partial pages too)}.
        self._seen: dict[int, dict[int, tuple[int, ...]]] = {}
        self._seen_tokens = 0

    # --- fed by the radix cache ------------------------------------------------------

    def evicted(self, chain: int, ts_ns: int, step: int) -> None:
        """A page with this chain hash left the cache (dropped, not offloaded)."""
        evicted = self._evicted
        # A re-evicted page keeps its place in the order (a pop to move it costs ~10% of
        # a replay's eviction time): the bound forgets by first eviction.
        evicted[chain] = (ts_ns, step)
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
                age_ns += ts_ns - when[0]
                age_steps += step - when[1]
            elif diverged:
                cold += ps
            else:
                shared = self._shared(chain, page) if tokens else 0
                granularity += shared
                cold += ps - shared
                diverged = True
            if tokens and remember:
                self._remember(chain, child, page)  # later requests may diverge inside it
            chain, j = child, j + 1
        covered = j * ps
        if tail is not None and covered + len(tail) - 1 == limit:  # the loop reached the tail
            rest = len(tail) - 1
            shared = 0 if diverged else min(rest, self._shared(chain, tail))
            granularity += shared
            cold += rest - shared
            self._remember(chain, chain_hash(chain, tail), tail)
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
        return max(shared_length(key, seen) for seen in children.values())

    def _remember(self, parent: int, child: int, key: tuple[int, ...]) -> None:
        if not self.granularity:
            return
        seen = self._seen
        children = seen.get(parent)
        if children is None:
            seen[parent] = children = {}
        elif child in children:
            return
        if len(children) >= self.max_children:
            self._seen_tokens -= len(children.pop(next(iter(children))))
        children[child] = key
        self._seen_tokens += len(key)
        while self._seen_tokens > self.max_seen_tokens and seen:
            oldest = next(iter(seen))
            self._seen_tokens -= sum(map(len, seen.pop(oldest).values()))

    @property
    def remembered(self) -> tuple[int, int]:
        """(evicted chain hashes, seen tokens) held now: the bounded memory, for tests."""
        return len(self._evicted), self._seen_tokens


__all__ = ["ROOT_CHAIN", "MissReasons", "MissSplit", "chain_hash", "shared_length"]
