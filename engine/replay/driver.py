"""Replay a request trace through the engine's own KV-cache machinery, with no model.

``ReplayDriver`` builds the real ``Scheduler``, ``KVCacheManager``,
``RadixCache`` (with the chosen eviction policy, belady included) and, for
offload or swap, a host tier of slots (engine/replay/host.py), then steps them
as ``Engine.step`` does, except that the model forward is replaced by nothing:
a step's tokens are simply marked computed and offered to the prefix cache.
Every KV decision is the engine's own code, and with a subscribed bus the
events are the engine's own events (a recorded replay is a run like any other).

Content: each request's prompt is a ``PageTokens`` (engine/replay/tokens.py):
one integer key per page derived from the trace's hash ids, so a page costs one
dict probe in the radix cache, not ``page_size`` tokens.

Time (``ReplayConfig.timing``):

- ``sequential``: one request after another, nothing concurrent, no compute
  time (the Mooncake paper's Figure 9). ``capacity_tokens`` caps what the
  prefix cache holds (its pages, the running request's included, as an LRU
  over blocks would count them); the pool has room for that plus the longest
  request, so every request runs.
- ``roofline``: arrivals from the trace's timestamps (divided by ``speed``);
  each step lasts the roofline time of its work on the device preset
  (engine/replay/timing.py). ``capacity_tokens`` is then the whole KV pool, as
  on a server: running requests hold pages while others arrive, and eviction,
  preemption and offload happen as the scheduler decides.

Refusals (as vLLM refuses them, never scheduled, counted in ``ReplayResult.refused``
by reason with the first offending trace line): a request whose prompt + output is
longer than ``max_model_len`` (vLLM's check of prompt + max_tokens against the
model's context), and, with roofline timing, one that needs more pages than the
whole pool. The figures are those of the admitted requests; the pool is sized for
them only, so a refused giant (1e8 tokens) costs nothing, where it had been decoded.

Decode steps of a replay do no work per token: when nothing is in prefill and
nothing new could be admitted, the running decodes advance together by ``k``
tokens in one scheduler step (``k`` bounded by the next arrival, the nearest
finish and the token budget), and the step lasts ``k`` decode steps.

API (for callers that route requests themselves, e.g. several replicas)::

    driver = ReplayDriver(trace, ReplayConfig(...), bus=None, prepared=None)
    result = driver.run()                     # the whole trace

    # or by hand:
    driver.add(i)                             # queue trace request i (at driver.now_s)
    while driver.has_work(): driver.step()    # one engine step
    driver.result()                           # figures so far

``driver.kv`` (KVCacheManager), ``driver.cache`` (RadixCache) and
``driver.scheduler`` are the engine objects; ``driver.requests`` maps trace
index to ``Request``. ``prepare(trace, page_size, belady)`` builds the page
keys once, to share between drivers (sweeps, replicas).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from kvscope.engine.errors import KvscopeError
from kvscope.engine.events import (
    ChunkScheduled,
    EventBus,
    FirstToken,
    RequestArrived,
    RequestFinished,
    RequestRejected,
    RequestScheduled,
    StepSummary,
    now_ns,
)
from kvscope.engine.kv_stack import build_kv_stack
from kvscope.engine.presets import device_preset, model_preset
from kvscope.engine.replay.config import ReplayConfig, ReplayResult, request_tokens
from kvscope.engine.replay.host import SlotTier
from kvscope.engine.replay.timing import Roofline
from kvscope.engine.replay.tokens import KeySpace, PageTokens
from kvscope.engine.replay.traces import ReplayTrace, TraceEntry, next_uses, page_contents
from kvscope.engine.request import Request, Status
from kvscope.engine.sampler import SamplingParams
from kvscope.engine.scheduler import Scheduler
from kvscope.engine.sizing import reload_cost

UNLIMITED_BATCH = 1 << 40


@dataclass(slots=True)
class Prepared:
    """A trace's page keys at one page size (and belady's next uses), built once."""

    page_size: int
    keys: list[list[int]]
    space: KeySpace
    uses: list[list[int]] | None = None


def prepare(trace: ReplayTrace, page_size: int, belady: bool = False) -> Prepared:
    keys, space = page_contents(trace, page_size)
    return Prepared(page_size, keys, space, next_uses(keys) if belady else None)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class ReplayDriver:
    def __init__(
        self,
        trace: ReplayTrace,
        config: ReplayConfig,
        bus: EventBus | None = None,
        prepared: Prepared | None = None,
    ) -> None:
        self.trace = trace
        self.config = cfg = config
        self.bus = bus or EventBus()
        ps = cfg.page_size
        belady = cfg.eviction_policy == "belady"
        if prepared is None or prepared.page_size != ps or (belady and prepared.uses is None):
            prepared = prepare(trace, ps, belady)
        self.prepared = prepared
        self.sequential = cfg.timing == "sequential"
        entries = trace.entries
        # Size the pool for the requests that can be admitted: one the context refuses
        # must not make every other point allocate (and sequential timing hold) its pages.
        pages = [-(-request_tokens(e) // ps) for e in entries if cfg.admits(e)]
        longest = max(pages, default=1)
        # More pages than the whole trace needs change nothing: a larger capacity is
        # "unlimited" (and must not allocate a pool of that size).
        total = max(1, sum(pages))  # every request refused: still a pool to refuse them with
        if cfg.capacity_tokens is None:
            self.cap_pages = None
            num_pages = total + 1
        elif self.sequential:
            self.cap_pages = min(cfg.capacity_tokens // ps, total)
            num_pages = self.cap_pages + longest + 1
        else:
            self.cap_pages = None
            num_pages = min(cfg.capacity_tokens // ps, total + 1)
            if num_pages < 2:
                raise KvscopeError(
                    f"a capacity of {cfg.capacity_tokens} tokens holds {num_pages} pages of {ps}"
                )
        self.bytes_per_token = cfg.bytes_per_token
        model = model_preset(cfg.model)
        device = device_preset(cfg.device)
        page_bytes = self.bytes_per_token * ps
        slots = max(1, cfg.host_tokens // ps)
        cost = reload_cost(
            model.num_params, self.bytes_per_token, device.pcie_gbps, device.fp16_tflops
        )
        offload = cfg.offload == "always" or (
            cfg.offload == "auto" and cost.recompute_over_load > 1.0
        )
        self.kv = kv = build_kv_stack(
            num_pages,
            ps,
            self.bus,
            host=(
                SlotTier(slots, page_bytes / (device.pcie_gbps * 1e9))
                if cfg.offload != "never" or cfg.preemption == "swap"
                else None
            ),
            eviction_policy=cfg.eviction_policy,
            should_offload=lambda: offload,
        )
        self.cache = kv.prefix
        batch = UNLIMITED_BATCH if self.sequential else cfg.max_batched_tokens
        from kvscope.engine.engine_config import EngineConfig  # the scheduler's knobs only

        self.engine_config = EngineConfig(
            kv_budget_bytes=max(1, int(num_pages * page_bytes)),
            page_size=ps,
            max_batched_tokens=int(min(batch, 1 << 31)),
            max_num_seqs=1 if self.sequential else cfg.max_num_seqs,
            preemption=cfg.preemption,
            offload=cfg.offload,
        )
        self.scheduler = Scheduler(self.engine_config, kv)
        self.roofline = Roofline.of(model, device, self.bytes_per_token)
        self.num_pages = num_pages
        self.requests: dict[int, Request] = {}
        self.now_s = 0.0
        self.step_count = 0
        self.finished = self.rejected = self.preemptions = 0
        self.refused: dict[str, dict] = {}
        self.ttfts: list[float] = []
        self.queues: list[float] = []
        self._arrival: dict[int, float] = {}
        self._changed = True  # something was admitted or finished: no decode burst yet
        maps = max(1, cfg.page_maps)
        self.page_map_every = max(
            1, (3 * len(entries) if self.sequential else 8 * len(entries)) // maps
        )
        self._wall = self._cpu = 0.0

    # --- requests ----------------------------------------------------------------------

    def _refusal(self, entry: TraceEntry) -> tuple[str, str] | None:
        """Why ``entry`` can never run here, as (reason, message), or None: checked at
        arrival, as vLLM checks, so it is never scheduled."""
        tokens = request_tokens(entry)
        need = -(-tokens // self.config.page_size)
        if not self.config.admits(entry):
            return "context", (
                f"{tokens:,} tokens (prompt + output) are longer than the model's context "
                f"of {self.config.max_model_len:,} tokens"
            )
        if need > self.num_pages:
            return "capacity", (
                f"{tokens:,} tokens need {need} pages of {self.config.page_size}; the whole "
                f"KV pool has {self.num_pages}"
            )
        return None

    def _refuse(self, index: int, refusal: tuple[str, str], tokens: int, ts: int) -> None:
        """Count a refusal by reason, keeping the first's trace line for the warning."""
        reason, message = refusal
        e = self.trace.entries[index]
        self.rejected += 1
        seen = self.refused.setdefault(
            reason, {"count": 0, "first": e.where or f"request {index}", "tokens": tokens}
        )
        seen["count"] += 1
        if self.bus.active:
            self.bus.emit(
                RequestArrived(ts, self.step_count, index, e.input_len, tokens - e.input_len)
            )
            self.bus.emit(RequestRejected(ts, self.step_count, index, message))

    def add(self, index: int) -> Request | None:
        """Queue trace request ``index`` now; None if it can never fit (rejected)."""
        e = self.trace.entries[index]
        out = max(1, e.output_len)
        ts = now_ns()
        refusal = self._refusal(e)
        if refusal is not None:
            self._refuse(index, refusal, e.input_len + out, ts)
            return None
        p = self.prepared
        tokens = PageTokens(
            p.keys[index],
            e.input_len,
            p.space,
            p.uses[index] if p.uses is not None else None,
            [] if self.config.cache_outputs else None,
            e.tokens,
        )
        emit = self.bus.active
        req = Request(
            request_id=index,
            prompt_ids=tokens,  # type: ignore[arg-type]  # page-keyed, see engine/replay/tokens.py
            params=SamplingParams(max_tokens=out),
            arrival_ns=ts,
            max_len=1 << 62,
        )
        self.requests[index] = req
        self._arrival[index] = self.now_s
        self.scheduler.add(req)
        self._changed = True
        if emit:
            self.bus.emit(RequestArrived(ts, self.step_count, index, e.input_len, out))
        return req

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # --- one step ----------------------------------------------------------------------

    def _burst(self) -> int:
        """How many decode steps the running requests take together in this step."""
        sched = self.scheduler
        running = sched.running
        if not running:
            return 1
        left = []
        for req in running:
            if req.num_computed < len(req.prompt_ids) or req.num_tokens - req.num_computed != 1:
                return 1  # a prefill (or a partly done burst) is in the batch
            left.append(req.params.max_tokens - len(req.output_ids))
        if self.sequential:
            return max(1, min(left))
        if sched.waiting and self._changed:
            return 1  # give the queue's head a normal step to be admitted
        k = min(min(left), self.config.max_batched_tokens // len(running))
        if self._next_arrival is not None:
            one = self._decode_step_s(running)
            steps = (self._next_arrival - self.now_s) / one if one > 0 else math.inf
            if steps < math.inf:  # an arrival too far off (--speed 1e-300) bounds nothing
                k = min(k, max(1, math.ceil(steps)))
        return max(1, k)

    def _decode_step_s(self, running: list[Request]) -> float:
        ctx = sum(r.num_computed for r in running)
        return self.roofline.step_s(len(running), ctx, ctx)

    _next_arrival: float | None = None

    def step(self) -> None:
        t0 = time.perf_counter()
        kv, sched, bus = self.kv, self.scheduler, self.bus
        emit = bus.active
        step = self.step_count
        kv.set_step(step)
        k = self._burst()
        if k > 1:
            for req in sched.running:
                req.output_ids.extend(
                    [0] * (min(k, req.params.max_tokens - len(req.output_ids)) - 1)
                )
        batch = sched.schedule()
        self._changed = bool(batch.preempted or batch.resumed)
        self.preemptions += len(batch.preempted)
        if emit:
            batch.emit_changes(bus, step)
        prefill = decode = 0
        pairs = read = 0.0
        ts = now_ns()
        done = []
        for req, n in zip(batch.requests, batch.num_new, strict=True):
            if req.scheduled_ns is None:
                req.scheduled_ns = ts
                self._changed = True
                self.queues.append(self.now_s - self._arrival[req.request_id])
                if emit:
                    bus.emit(RequestScheduled(ts, step, req.request_id, req.num_cached))
            start = req.num_computed
            in_prefill = start < len(req.prompt_ids)
            if in_prefill:
                prefill += n
                if emit and (n < len(req.prompt_ids) - start or start > req.num_cached):
                    bus.emit(ChunkScheduled(ts, step, req.request_id, start, n))
            else:
                decode += n
            pairs += n * start + n * (n + 1) / 2
            # a prefill chunk reads its context once; a burst of n decode steps, n times
            read += start if n == 1 or in_prefill else n * start + n * (n - 1) / 2
            req.num_computed = start + n
            kv.offer(req)
            if req.num_computed == req.num_tokens:
                done.append(req)
        seconds = 0.0
        if not self.sequential:
            if k > 1 and not prefill:
                seconds = k * self.roofline.step_s(len(batch.requests), pairs / k, read / k)
            else:
                seconds = self.roofline.step_s(prefill + decode, pairs, read)
            host = kv.host
            if host is not None:
                seconds += host.copy_s
                host.copy_s = 0.0
            self.now_s += seconds
        for req in done:
            self._sample(req)
        if self.cap_pages is not None:
            excess = self.cache.device_pages - self.cap_pages
            if excess > 0:
                self.cache.evict(excess)
        if self.config.check_every and step % self.config.check_every == 0:
            kv.check_integrity()
        if emit:
            if step % self.page_map_every == 0:
                kv.emit_page_map()
            tokens_held, pages_cached = kv.occupancy()
            pool = kv.pool
            wall = time.perf_counter() - t0
            bus.emit(
                StepSummary(
                    now_ns(), step,
                    batch_size=len(batch.requests), prefill_tokens=prefill, decode_tokens=decode,
                    running=len(sched.running), waiting=len(sched.waiting),
                    pages_total=pool.num_pages, pages_used=pool.num_used,
                    pages_cached=pages_cached, pages_free=pool.num_free,
                    page_size=pool.page_size, tokens_held=tokens_held,
                    host_pages_used=kv.host_pages_used,
                    duration_s=wall if self.sequential else seconds,
                )
            )  # fmt: skip
        self.step_count += 1

    def _sample(self, req: Request) -> None:
        """The step's "model" produced one token for ``req``; finish it at its length."""
        req.output_ids.append(0)
        if req.first_token_ns is None:
            req.first_token_ns = now_ns()
            ttft = self.now_s - self._arrival[req.request_id]
            self.ttfts.append(ttft)
            if self.bus.active:
                self.bus.emit(FirstToken(req.first_token_ns, self.step_count, req.request_id, ttft))
        if len(req.output_ids) >= req.params.max_tokens:
            self._finish(req)

    def _finish(self, req: Request) -> None:
        req.status = Status.FINISHED
        req.finish_reason = "length"
        req.finish_ns = now_ns()
        self.scheduler.finish(req)
        self.kv.release(req)
        self.finished += 1
        self._changed = True
        if self.bus.active:
            n = len(req.output_ids)
            self.bus.emit(
                RequestFinished(
                    req.finish_ns, self.step_count, req.request_id, len(req.prompt_ids), n,
                    req.num_cached, "length", self.ttfts[-1] if self.ttfts else 0.0, 0.0,
                )
            )  # fmt: skip
        # Done: drop the request's content (a whole trace of them is a lot of memory).
        del self.requests[req.request_id]
        req.output_ids = []

    # --- the whole trace ------------------------------------------------------------------

    def run(
        self,
        progress: Callable[[int, int], None] | None = None,
        throttle: Callable[[], None] | None = None,
    ) -> ReplayResult:
        """Replay every request; ``progress(done, total)`` now and then, ``throttle()``
        every few steps (a recorder that needs the engine to wait for its writer)."""
        t0, c0 = time.perf_counter(), time.process_time()
        entries = self.trace.entries
        n = len(entries)
        every = max(1, n // 100)
        if self.sequential:
            for i in range(n):
                if self.add(i) is None:
                    continue
                while self.scheduler.has_work():
                    self.step()
                if progress is not None and i % every == 0:
                    progress(i + 1, n)
                if throttle is not None and i % 16 == 0:
                    throttle()
        else:
            speed = self.config.speed
            arrivals = [e.arrival_s / speed for e in entries]
            nxt = 0
            while nxt < n or self.scheduler.has_work():
                if not self.scheduler.has_work() and nxt < n:
                    self.now_s = max(self.now_s, arrivals[nxt])
                while nxt < n and arrivals[nxt] <= self.now_s:
                    self.add(nxt)
                    nxt += 1
                    if progress is not None and nxt % every == 0:
                        progress(nxt, n)
                self._next_arrival = arrivals[nxt] if nxt < n else None
                if self.scheduler.has_work():
                    self.step()
                    if throttle is not None and self.step_count % 64 == 0:
                        throttle()
        if progress is not None:
            progress(n, n)
        self._wall += time.perf_counter() - t0
        self._cpu += time.process_time() - c0
        return self.result()

    def result(self) -> ReplayResult:
        kv = self.kv
        host = kv.host
        return ReplayResult(
            requests=len(self.trace.entries),
            finished=self.finished,
            rejected=self.rejected,
            queried_tokens=kv.prefix_queried_tokens,
            hit_tokens=kv.prefix_hit_tokens,
            steps=self.step_count,
            evicted_pages=self.cache.evictions,
            offloaded_pages=host.stores if host is not None else 0,
            reloaded_pages=host.loads if host is not None else 0,
            preemptions=self.preemptions,
            pool_pages=self.num_pages,
            capacity_tokens=self.config.capacity_tokens,
            wall_s=self._wall,
            cpu_s=self._cpu,
            simulated_s=self.now_s,
            ttft_mean_s=sum(self.ttfts) / len(self.ttfts) if self.ttfts and not self.sequential else None,
            ttft_p50_s=None if self.sequential else _quantile(self.ttfts, 0.5),
            ttft_p99_s=None if self.sequential else _quantile(self.ttfts, 0.99),
            queue_mean_s=sum(self.queues) / len(self.queues) if self.queues and not self.sequential else None,
            queue_p99_s=None if self.sequential else _quantile(self.queues, 0.99),
            refused={k: dict(v) for k, v in self.refused.items()},
            extra={
                "miss_reasons": asdict(kv.prefix_misses),  # engine/miss_reasons.py
                # re-lookups of preempted requests, not in the hit rate (kv_manager.admitted)
                "preempted_lookups": {
                    "queried_tokens": kv.preempted_queried_tokens,
                    "hit_tokens": kv.preempted_hit_tokens,
                },
            },
        )  # fmt: skip
