"""One builder of the KV stack: the page pool, the host tier, the prefix cache with
its eviction policy, and the manager over them, each handed what it needs once.

The engine and the replay driver differ only in what they give it: the engine a
``HostTier`` over its real KV tensors, the replay a ``SlotTier`` that only counts
slots and transfer time; both the same pool, cache and manager. Nothing is set
on the manager afterwards, so what a stack holds is what this built.
"""

from __future__ import annotations

from collections.abc import Callable

from kvscope.engine.events import EventBus
from kvscope.engine.eviction import make_policy
from kvscope.engine.host_tier import HostTier
from kvscope.engine.kv_manager import KVCacheManager
from kvscope.engine.page_pool import PagePool
from kvscope.engine.radix_cache import RadixCache


def build_kv_stack(
    num_pages: int,
    page_size: int,
    bus: EventBus,
    *,
    host: HostTier | None = None,
    prefix_cache: bool = True,
    eviction_policy: str = "lru",
    should_offload: Callable[[], bool] = lambda: False,
) -> KVCacheManager:
    """A manager over a pool of ``num_pages`` pages of ``page_size`` tokens; ``host``
    is the host tier (offload, swap, InfLLM's distant blocks) where there is one;
    ``prefix_cache`` adds a radix cache evicting by ``eviction_policy`` that offloads
    what it evicts to the host tier while ``should_offload()`` says so."""
    pool = PagePool(num_pages, page_size)
    prefix = (
        RadixCache(pool, bus, make_policy(eviction_policy), host, should_offload=should_offload)
        if prefix_cache
        else None
    )
    return KVCacheManager(pool, bus, prefix=prefix, host=host)
