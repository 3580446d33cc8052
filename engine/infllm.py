"""InfLLM attention: sinks + a local window resident, distant context as retrievable blocks.

Following InfLLM (Xiao et al., 2024), a request's KV is split into the
*initial* tokens (attention sinks), the *local* window (the most recent
tokens) and the distant tokens between them, grouped into memory blocks of
``block_pages`` pages. When a block leaves the local window its pages are
copied to the host tier and freed on the device; the block keeps a small
summary per layer and KV head, computed once, that retrieval scores queries
against. Two summaries (``--infllm-repr``):

- ``centroid`` (default): each page's mean key, taken after undoing each
  key's rope rotation (pre-rope keys share one frame, so their mean keeps
  every channel). Queries are scored against the centroids at
  InfLLM's fixed distance (below); each query head's scores over all
  centroids become a softmax, and a block's score is the probability mass
  its centroids receive, summed over heads and queries, so a head with large
  logits cannot outvote the others.
- ``exact``: no summary; every step scores all of a block's keys, read back
  from the host tier. It reads as much as full attention does, so it serves
  nothing; it measures the best any summary could do at the same top-k
  (``kvscope eval`` compares the three).
- ``attended``: InfLLM's representative tokens, the ``repr_tokens`` keys
  that received the highest attention score from the local-window queries
  that followed them (``r_m = sum_j q_{m+j} . k_m``, accumulated while the
  token sits in the local window), un-rotated to position 0 and scored at one
  fixed distance with the summed query, as the paper does.

Centroids are the default: on every pass-key case and perplexity text
measured they retrieve as well as the attended tokens (docs/infllm.md), and
they need no attention statistics, so a step skips accumulating scores over
the local window in every layer.
Both summaries are kept in fp16 and, like the local window, live on the
device: a request's ``resident_bytes`` counts them.

Scoring at one fixed distance: InfLLM gives all distant tokens one position
(the local window size). Summaries sit at position 0 and each step's queries
are un-rotated from their own positions and rotated to that distance, so
every block is scored at the same distance and the ranking reflects content,
not how far back a block is (with true distances, recent blocks win and
old needles are missed).

Every layer of every step, each request's queries score the distant blocks;
the top-k blocks are brought into a small per-request device cache of
retrieved blocks (LRU per layer, since each layer retrieves its own blocks)
and the layer attends over ``initial pages + retrieved blocks (in position
order) + local pages`` through the same paged kernels: only the page table
differs.

Positions: K is rotated (rope) with its absolute position when it is written
to the cache, so retrieved tokens keep their original positions. InfLLM gives
all distant tokens one fixed distance (the local window size) to extrapolate
beyond the trained context; this engine never exceeds the model's context, so
original positions are within the trained range and re-rotating K on every
retrieval (which would also make retrieval copies step-dependent) is not done.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import InfLLMRetrieval, PageOffloaded, PagesAllocated, PagesFreed, now_ns
from kvscope.engine.kv_manager import OFFLOADED
from kvscope.engine.model import RotaryTable, apply_rotary
from kvscope.kernels.metadata import AttentionMetadata

if TYPE_CHECKING:
    from kvscope.engine.engine_config import EngineConfig
    from kvscope.engine.kv_manager import KVCacheManager
    from kvscope.engine.kv_storage import KVStorage
    from kvscope.engine.request import Request


@dataclass(slots=True)
class BlockCache:
    """One layer's view of a request's retrieved-block cache: which block each slot holds."""

    lru: OrderedDict[int, int] = field(default_factory=OrderedDict)  # block -> slot, oldest first

    def lookup(self, block: int) -> int | None:
        slot = self.lru.get(block)
        if slot is not None:
            self.lru.move_to_end(block)
        return slot

    def place(self, block: int, num_slots: int, keep: set[int]) -> int:
        """A slot for ``block``: a free one, else the least recently used not in ``keep``."""
        used = set(self.lru.values())
        free = [s for s in range(num_slots) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(b for b in self.lru if b not in keep)
            slot = self.lru.pop(victim)
        self.lru[block] = slot
        return slot


@dataclass(slots=True)
class RequestMemory:
    """One request's InfLLM state."""

    host_slots: list[list[int]] = field(default_factory=list)  # per distant block, per page
    summaries: torch.Tensor | None = None  # fp16 [L, blocks, r, Hkv, D], grown per block
    scores: torch.Tensor | None = None  # [L, positions, Hkv] attended representativeness
    cache_pages: list[int] = field(default_factory=list)  # device pages of the retrieved blocks
    caches: list[BlockCache] = field(default_factory=list)  # per layer

    @property
    def num_blocks(self) -> int:
        return len(self.host_slots)

    @property
    def summary_bytes(self) -> int:
        return 0 if self.summaries is None else self.summaries.nbytes

    def add_summary(self, summary: torch.Tensor) -> None:
        """Append the next block's summary ``[L, r, Hkv, D]`` (kept in fp16)."""
        block = summary.half()[:, None]
        self.summaries = block if self.summaries is None else torch.cat([self.summaries, block], 1)


@dataclass(slots=True)
class _Row:
    """One request's part of the step: where its queries are and which pages are resident."""

    req: Request
    memory: RequestMemory
    q_start: int
    q_end: int
    initial: list[int]
    local: list[int]
    local_start: int  # position of the first local token
    kv_end: int  # tokens in the sequence after this step


@dataclass(slots=True)
class _StepTally:
    chosen: dict[int, int] = field(default_factory=dict)  # block -> layers that chose it
    scored: int = 0
    reloaded: int = 0
    hits: int = 0
    seconds: float = 0.0


class InfLLMMemory:
    """Block memory, representative keys, retrieval and the retrieved-block caches of all requests."""

    def __init__(
        self, config: EngineConfig, kv: KVCacheManager, storage: KVStorage, rope: RotaryTable
    ) -> None:
        if kv.host is None:
            raise KvscopeError("infllm attention needs the host tier")
        self.kv = kv
        self.storage = storage
        ps = storage.page_size
        self.page_size = ps
        self.initial_pages = -(-config.infllm_initial_tokens // ps)
        self.local_pages = -(-config.infllm_local_tokens // ps)
        self.block_pages = config.infllm_block_pages
        self.topk = config.infllm_topk_blocks
        self.repr = config.infllm_repr
        # Representatives per block: one centroid per page, or the most attended tokens
        # (exact scoring reads the keys themselves; its centroids cost one mean per page).
        self.repr_tokens = (
            min(config.infllm_repr_tokens, self.block_pages * ps)
            if self.repr == "attended"
            else self.block_pages
        )
        self.page_bytes = storage.nbytes // storage.data.shape[1]
        self.rope = rope
        # Retrieval scores every block at one fixed distance, the local window's (InfLLM).
        self.score_position = self.local_pages * ps
        self.requests: dict[int, RequestMemory] = {}
        self._rows: list[_Row] = []
        self._tally: dict[int, _StepTally] = {}
        # Device pages whose blocks went to the host tier, and the step they went in: the
        # page map's "offloaded" state of that step (the radix cache's evicted_step).
        self.offloaded_step: dict[int, str] = {}
        self._offloaded_at = -1

    def offloaded_pages(self, step: int) -> dict[int, str]:
        """Pages offloaded at ``step`` (page -> "offloaded"), empty for any other step."""
        return dict(self.offloaded_step) if step == self._offloaded_at else {}

    # --- per step ----------------------------------------------------------------

    def plan(self, requests: list[Request], num_new: list[int]) -> AttentionMetadata:
        """Offload blocks that left the local window, size the caches; the resident page table.

        The returned metadata (initial + local pages) is the step's table without
        retrieved blocks; ``layer_metadata`` adds each layer's blocks.
        """
        ps, bp = self.page_size, self.block_pages
        self._rows, self._tally = [], {}
        q_start = 0
        for req, n in zip(requests, num_new, strict=True):
            mem = self.requests.setdefault(req.request_id, RequestMemory())
            start, end = req.num_computed, req.num_computed + n
            if self.repr == "attended":
                self._grow_scores(mem, end)
            # A block is distant once all of its pages are before the local window.
            window_page = max(self.initial_pages, (start - self.local_pages * ps) // ps)
            while self.initial_pages + (mem.num_blocks + 1) * bp <= window_page:
                self._offload_block(req, mem)
            local_first = self.initial_pages + mem.num_blocks * bp
            used = -(-end // ps)
            self._size_cache(req, mem)
            initial = req.pages[: min(self.initial_pages, used)]
            local = req.pages[local_first:used] if used > local_first else []
            self._rows.append(
                _Row(req, mem, q_start, q_start + n, initial, local, local_first * ps, end)
            )
            q_start += n
        return self._metadata([r.initial + r.local for r in self._rows])

    def layer_metadata(
        self, layer: int, q: torch.Tensor, pages: torch.Tensor, resident: AttentionMetadata
    ) -> AttentionMetadata:
        """The page table for ``layer``: resident pages plus the blocks its queries retrieve.

        Also accumulates the local tokens' representativeness from these queries
        (``pages`` already holds the step's new K).
        """
        t0 = time.perf_counter()
        tables = []
        changed = False
        for row in self._rows:
            mem = row.memory
            qr = q[row.q_start : row.q_end]
            if self.repr == "attended":
                self._accumulate(layer, row, qr, pages)
            if mem.num_blocks == 0:
                tables.append(row.initial + row.local)
                continue
            changed = True
            blocks = self._select(layer, mem, qr, row.kv_end)
            tally = self._tally.setdefault(row.req.request_id, _StepTally())
            tally.scored += mem.num_blocks
            retrieved = []
            for b in blocks:
                tally.chosen[b] = tally.chosen.get(b, 0) + 1
                retrieved.extend(self._fetch(layer, mem, b, set(blocks), tally))
            tables.append(row.initial + retrieved + row.local)
        meta = self._metadata(tables) if changed else resident
        for tally in self._tally.values():
            tally.seconds += time.perf_counter() - t0
        return meta

    def finish_step(self) -> None:
        """One retrieval event per request that has distant blocks (summed over layers)."""
        bus = self.kv.bus
        if bus.active:
            for row in self._rows:
                tally = self._tally.get(row.req.request_id)
                if tally is None:
                    continue
                mem = row.memory
                chosen = sorted(tally.chosen)
                bus.emit(
                    InfLLMRetrieval(
                        now_ns(),
                        self.kv.step,
                        row.req.request_id,
                        blocks_total=mem.num_blocks,
                        blocks_scored=tally.scored,
                        chosen_blocks=tuple(chosen),
                        chosen_layers=tuple(tally.chosen[b] for b in chosen),
                        blocks_reloaded=tally.reloaded,
                        cache_hits=tally.hits,
                        resident_bytes=self.resident_bytes(row.req),
                        offloaded_bytes=mem.num_blocks * self.block_pages * self.page_bytes,
                        seconds=tally.seconds,
                    )
                )
        self._rows, self._tally = [], {}

    # --- bookkeeping shared with the KV manager -----------------------------------

    def resident_bytes(self, req: Request) -> int:
        """Device bytes the request holds: its resident pages and its blocks' summaries."""
        mem = self.requests.get(req.request_id)
        summaries = 0 if mem is None else mem.summary_bytes
        return self.resident_pages(req) * self.page_bytes + summaries

    def resident_pages(self, req: Request) -> int:
        mem = self.requests.get(req.request_id)
        offloaded = 0 if mem is None else mem.num_blocks * self.block_pages
        cache = 0 if mem is None else len(mem.cache_pages)
        return len(req.pages) - offloaded + cache

    def cache_pages(self, req: Request) -> list[int]:
        mem = self.requests.get(req.request_id)
        return [] if mem is None else mem.cache_pages

    def host_slots(self) -> set[int]:
        return {s for mem in self.requests.values() for block in mem.host_slots for s in block}

    def drop(self, req: Request) -> list[int]:
        """Forget a request: its host slots go back; returns its cache pages for the caller to free."""
        mem = self.requests.pop(req.request_id, None)
        if mem is None:
            return []
        for block in mem.host_slots:
            for slot in block:
                self.kv.host.release(slot)
        return mem.cache_pages

    # --- internals --------------------------------------------------------------------

    def _metadata(self, tables: list[list[int]]) -> AttentionMetadata:
        ps = self.page_size
        lens = []
        for table, row in zip(tables, self._rows, strict=True):
            last = row.kv_end - (-(-row.kv_end // ps) - 1) * ps
            lens.append((len(table) - 1) * ps + last)
        return AttentionMetadata.build(
            tables,
            [r.q_end - r.q_start for r in self._rows],
            lens,
            ps,
            device=self.storage.data.device,
        )

    def _grow_scores(self, mem: RequestMemory, end: int) -> None:
        data = self.storage.data  # [L, P, 2, ps, Hkv, D]
        have = 0 if mem.scores is None else mem.scores.shape[1]
        if end <= have:
            return
        size = max(end, 2 * have, 256)
        grown = torch.zeros(data.shape[0], size, data.shape[4], device=data.device)
        if mem.scores is not None:
            grown[:, :have] = mem.scores
        mem.scores = grown

    def _accumulate(self, layer: int, row: _Row, q: torch.Tensor, pages: torch.Tensor) -> None:
        """Add each local token's attention logits from the later queries of this step."""
        if not row.local:
            return
        ids = torch.tensor(row.local, dtype=torch.long, device=pages.device)
        # Slots past the sequence's end hold stale data: cut them off.
        k = pages[ids, 0].flatten(0, 1)[: row.kv_end - row.local_start].to(q.dtype)  # [T, Hkv, D]
        num_kv = k.shape[1]
        qg = q.view(q.shape[0], num_kv, -1, q.shape[-1]).sum(2)  # [n, Hkv, D]
        logits = torch.einsum("nhd,thd->nth", qg, k)
        k_pos = torch.arange(row.local_start, row.local_start + k.shape[0], device=q.device)
        q_pos = torch.arange(row.kv_end - q.shape[0], row.kv_end, device=q.device)
        later = (q_pos[:, None] > k_pos[None, :]).to(logits.dtype)
        gained = torch.einsum("nth,nt->th", logits, later)
        row.memory.scores[layer, row.local_start : row.local_start + k.shape[0]] += gained

    def _offload_block(self, req: Request, mem: RequestMemory) -> None:
        """Representative keys from the accumulated scores, then the pages go to the host tier."""
        ps, bp = self.page_size, self.block_pages
        first = self.initial_pages + mem.num_blocks * bp
        pages = req.pages[first : first + bp]
        ids = torch.tensor(pages, dtype=torch.long, device=self.storage.data.device)
        keys = self.storage.data[:, ids, 0].float().flatten(1, 2)  # [L, T, Hkv, D]
        # Undo the rope of each key's own position: summaries sit at position 0.
        positions = torch.arange(first * ps, (first + bp) * ps, device=ids.device)
        cos, sin = self.rope.lookup(positions)
        keys = apply_rotary(keys, cos, -sin)
        if self.repr == "attended":
            scores = mem.scores[:, first * ps : (first + bp) * ps]  # [L, T, Hkv]
            top = scores.topk(self.repr_tokens, dim=1).indices  # [L, r, Hkv]
            index = top[..., None].expand(-1, -1, -1, keys.shape[-1])
            mem.add_summary(keys.gather(1, index))
        else:  # one centroid per page, [L, bp, Hkv, D]
            mem.add_summary(keys.view(keys.shape[0], bp, ps, *keys.shape[2:]).mean(2))
        host = self.kv.host
        if host.num_free < bp:
            raise KvscopeError("infllm: the host tier is full; raise --host-budget")
        slots, seconds = host.store_many(pages)  # one copy per run of slots
        mem.host_slots.append(slots)
        for i in range(first, first + bp):
            req.pages[i] = OFFLOADED
        self.kv.pool.decref(pages)
        step = self.kv.step
        if step != self._offloaded_at:
            self.offloaded_step, self._offloaded_at = {}, step
        self.offloaded_step.update(dict.fromkeys(pages, "offloaded"))
        bus = self.kv.bus
        if bus.active:
            ts = now_ns()
            bus.emit(PagesFreed(ts, step, req.request_id, tuple(pages)))
            # one offload per page (the copy's seconds shared out), as the radix cache counts
            for page, slot in zip(pages, slots, strict=True):
                bus.emit(PageOffloaded(ts, step, page, slot, seconds / len(pages)))

    def _size_cache(self, req: Request, mem: RequestMemory) -> None:
        """Grow the retrieved-block cache to min(topk, blocks) blocks of device pages."""
        want = min(self.topk, mem.num_blocks) * self.block_pages
        missing = want - len(mem.cache_pages)
        if missing <= 0:
            return
        if self.kv.pool.num_free < missing:
            self.kv.reclaim(missing - self.kv.pool.num_free)
        if self.kv.pool.num_free < missing:
            raise KvscopeError(
                "infllm: no free pages for the retrieved-block cache; raise --kv-budget"
            )
        pages = self.kv.pool.allocate(missing)
        mem.cache_pages.extend(pages)
        if not mem.caches:
            mem.caches = [BlockCache() for _ in range(self.storage.data.shape[0])]
        if self.kv.bus.active:
            self.kv.bus.emit(PagesAllocated(now_ns(), self.kv.step, req.request_id, tuple(pages)))

    def _select(self, layer: int, mem: RequestMemory, q: torch.Tensor, end: int) -> list[int]:
        """The top-k distant blocks for the queries ``q`` (positions ``end - len(q) .. end - 1``)."""
        if self.repr == "exact":  # every key as attention sees it, at its true position
            flat = [s for block in mem.host_slots for s in block]
            self.kv.host.wait_host(flat)  # the offload copies run asynchronously on CUDA
            keys = self.kv.host.tensors[0][
                torch.tensor(flat), layer, 0
            ]  # [blocks x bp, ps, Hkv, D]
            keys = keys.to(q.device).view(mem.num_blocks, -1, *keys.shape[-2:]).float()
            scores = self._mass_scores(keys, q.float())
        else:
            reps = mem.summaries[layer].float()  # [blocks, r, Hkv, D]
            q = self._at_fixed_distance(q, end)
            if self.repr == "attended":
                num_kv = reps.shape[2]
                query = q.view(q.shape[0], num_kv, -1, q.shape[-1]).sum((0, 2))  # [Hkv, D]
                scores = torch.einsum("brhd,hd->b", reps, query)  # InfLLM's summed score
            else:
                scores = self._mass_scores(reps, q)
        k = min(self.topk, mem.num_blocks)
        return sorted(scores.topk(k).indices.tolist())

    def _at_fixed_distance(self, q: torch.Tensor, end: int) -> torch.Tensor:
        """``q`` (positions ``end - len(q) .. end - 1``) re-rotated to ``score_position``."""
        cos, sin = self.rope.lookup(torch.arange(end - q.shape[0], end, device=q.device))
        q = apply_rotary(q.float(), cos, -sin)
        fixed = torch.full((q.shape[0],), self.score_position, device=q.device)
        return apply_rotary(q, *self.rope.lookup(fixed))

    @staticmethod
    def _mass_scores(reps: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Each block's share of every query head's softmax over all blocks' keys, summed.

        ``reps`` are page centroids (or, for ``exact``, every key); the softmax
        per query head makes every head and query count once, whatever the
        scale of its logits.
        """
        blocks, r, num_kv, d = reps.shape
        qh = q.view(q.shape[0], num_kv, -1, d)  # [n, Hkv, G, D]
        logits = torch.einsum("nhgd,brhd->nhgbr", qh, reps) * d**-0.5
        mass = torch.softmax(logits.flatten(3), dim=-1).view(logits.shape)
        return mass.sum((0, 1, 2, 4))

    def _fetch(
        self, layer: int, mem: RequestMemory, block: int, keep: set[int], tally: _StepTally
    ) -> list[int]:
        """The device pages holding ``block`` for ``layer``; reloads it from the host on a miss."""
        cache = mem.caches[layer]
        bp = self.block_pages
        slot = cache.lookup(block)
        if slot is None:
            slot = cache.place(block, len(mem.cache_pages) // bp, keep)
            # Asynchronous on CUDA: the compute stream waits for it before this layer attends.
            self.kv.host.read(
                mem.host_slots[block], mem.cache_pages[slot * bp : (slot + 1) * bp], layer
            )
            tally.reloaded += 1
        else:
            tally.hits += 1
        return mem.cache_pages[slot * bp : (slot + 1) * bp]
