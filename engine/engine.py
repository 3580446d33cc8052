"""The engine: requests in, tokens out, every KV-cache decision on the event bus.

``Engine.add_request`` validates and queues; ``Engine.step`` schedules one
batch, runs the model once and samples; ``generate`` and ``stream`` loop over
steps. With async scheduling on (``engine.async_step``) a step launches the
next batch before it reads the previous one's tokens, so ``step`` returns the
tokens of the step before it. A bad request is refused with a ``RequestError`` (and a
``RequestRejected`` event) while the others keep running.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator

import torch

from kvscope.engine.async_step import LaunchedStep, feed_for
from kvscope.engine.dummy import dummy_shell, is_dummy_shell, load_dummy
from kvscope.engine.engine_config import EngineConfig
from kvscope.engine.errors import KvscopeError, RequestError
from kvscope.engine.events import (
    ChunkScheduled,
    EventBus,
    FirstToken,
    KernelTiming,
    MemoryBudgetMeasured,
    RequestArrived,
    RequestFinished,
    RequestRejected,
    RequestScheduled,
    StepSummary,
    now_ns,
)
from kvscope.engine.host_tier import HostTier
from kvscope.engine.infllm import InfLLMMemory
from kvscope.engine.kv_stack import build_kv_stack
from kvscope.engine.kv_storage import KVStorage
from kvscope.engine.loader import LoadedModel, load_model
from kvscope.engine.memory_budget import kv_budget_from_terms, measure_budget, predicted_kv_bytes
from kvscope.engine.model import DecoderModel
from kvscope.engine.presets import device_preset
from kvscope.engine.request import Request, Status
from kvscope.engine.runner import ModelRunner
from kvscope.engine.sampler import SampledTokens, SamplingParams
from kvscope.engine.scheduler import ScheduledBatch, Scheduler
from kvscope.engine.sizing import kv_bytes_per_token, pool_pages, reload_cost


class RequestOutput:
    """One request's state after a step that gave it a token.

    ``token_ids`` (every output token so far) is built when read, from the
    request's own list and its length at this step: copying it into every
    output cost O(tokens) per request per step, which at batch 128 was a large
    share of a decode step's host time. The request's list only ever grows, so
    the prefix is exactly what it held then.
    """

    __slots__ = (
        "request_id",
        "prompt",
        "text",
        "finish_reason",
        "finished",
        "new_token_ids",
        "_ids",
        "_n",
    )

    def __init__(
        self,
        request_id: int,
        prompt: str,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        finished: bool,
        new_token_ids: list[int],
        num_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.text = text
        self.finish_reason = finish_reason
        self.finished = finished
        self.new_token_ids = new_token_ids
        self._ids = token_ids
        self._n = len(token_ids) if num_tokens is None else num_tokens

    @property
    def token_ids(self) -> list[int]:
        return self._ids[: self._n]

    def _fields(self) -> tuple:
        return (
            self.request_id,
            self.prompt,
            self.text,
            self.token_ids,
            self.finish_reason,
            self.finished,
            self.new_token_ids,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestOutput):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        names = self.__slots__[:3] + ("token_ids",) + self.__slots__[3:6]
        body = ", ".join(f"{k}={v!r}" for k, v in zip(names, self._fields(), strict=True))
        return f"RequestOutput({body})"


def resolve_attention_backend(config: EngineConfig) -> str:
    """``torch`` or ``triton`` for this device; a clear error when Triton cannot run here."""
    from kvscope.kernels import BackendError, resolve_backend

    try:
        return resolve_backend(config.attention_backend, config.device)
    except BackendError as exc:
        raise KvscopeError(str(exc)) from None


class Engine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        bus: EventBus | None = None,
        loaded: LoadedModel | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        self.device = config.device
        if self.device.startswith("cuda"):
            # Streams, events and Triton launches default to the current device: on cuda:N
            # (N > 0) an event recorded on device 0's stream would not fence our copies.
            torch.cuda.set_device(torch.device(self.device))
        self.bus = bus or EventBus()
        if loaded is None:
            load = dummy_shell if config.load_format == "dummy" else load_model
            loaded = load(config.model)
        # Dummy weights are drawn here and dropped once the model holds its own copies
        # (an 8B model's draw is 16 GB); an engine sharing the shell draws the same again.
        dummy = is_dummy_shell(loaded)
        if dummy:
            loaded = load_dummy(loaded.config, config.weights_dtype, config.device)
        self.model = DecoderModel(
            loaded.config, loaded.weights, config.weights_dtype, config.device
        )
        if dummy:
            loaded = dataclasses.replace(loaded, weights={})
        self.loaded = loaded
        self.codec = loaded.codec
        mcfg = loaded.config
        self.model_config = mcfg
        self.bytes_per_token = kv_bytes_per_token(
            mcfg.num_layers, mcfg.num_kv_heads, mcfg.head_dim, config.kv_dtype
        )
        self.budget = measure_budget(
            self.model,
            config.device,
            config.memory_fraction,
            config.max_batched_tokens,
            config.max_num_seqs,
        )
        self.kv_budget_bytes = (
            config.kv_budget_bytes
            if config.kv_budget_bytes is not None
            else kv_budget_from_terms(self.budget)
        )
        page_bytes = self.bytes_per_token * config.page_size
        num_pages = pool_pages(self.kv_budget_bytes, self.bytes_per_token, config.page_size)
        self.num_pages = num_pages
        self.backend = resolve_attention_backend(config)
        # CUDA graphs replay decode steps on CUDA with the Triton kernels (see cuda_graphs);
        # InfLLM picks each layer's pages per step on the host, so it stays eager. Padded
        # rows of a graph's batch bucket use one scratch page past the pool's pages.
        use_graphs = (
            config.device.startswith("cuda")
            and config.attention_mode == "full"
            and self.backend == "triton"
            and not config.enforce_eager
        )
        self.storage = KVStorage(
            mcfg.num_layers,
            num_pages + (1 if use_graphs else 0),
            config.page_size,
            mcfg.num_kv_heads,
            mcfg.head_dim,
            config.kv_dtype,
            config.device,
        )
        # The offload cost model (per token, so the decision does not depend on p):
        # recompute 2P FLOPs at the device's compute vs reload the KV bytes over its host link.
        self.cost_device = device_preset(self.config.cost_device)
        self.offload_cost = reload_cost(
            mcfg.num_params,
            self.bytes_per_token,
            self.cost_device.pcie_gbps,
            self.cost_device.fp16_tflops,
        )
        needs_host = (
            config.offload != "never"
            or config.preemption == "swap"
            or config.attention_mode == "infllm"
        )
        slots = max(1, int(config.host_budget_bytes // page_bytes))
        # InfLLM moves a request's distant pages to the host tier, so they cannot be shared.
        self.kv = build_kv_stack(
            num_pages,
            config.page_size,
            self.bus,
            host=HostTier(self.storage.tensors, slots) if needs_host else None,
            prefix_cache=config.prefix_cache and config.attention_mode == "full",
            eviction_policy=config.eviction_policy,
            should_offload=self._should_offload,
        )
        self.runner = ModelRunner(
            self.model, self.storage, self.backend, config.device, kernel_sink=self._on_kernel
        )
        # Autotuning happens here, at start-up, on every prefill query-length class.
        self.runner.warm_up_prefill(config.max_batched_tokens)
        if use_graphs:
            pages_per_seq = math.ceil(self.max_request_tokens / config.page_size)
            self.runner.capture_decode_graphs(config.max_num_seqs, pages_per_seq, num_pages)
        if self.config.attention_mode == "infllm":
            self.kv.infllm = self.runner.infllm = InfLLMMemory(
                self.config, self.kv, self.storage, self.model.rope
            )
        self.scheduler = Scheduler(self.config, self.kv)
        self.step_count = 0
        self._last_page_map_s = -math.inf
        self._next_id = 0
        self.requests: dict[int, Request] = {}
        self.total_output_tokens = 0
        # Async scheduling needs the full CSR path: InfLLM plans each step's pages on the host.
        self.async_scheduling = config.async_scheduling == "on" and config.attention_mode == "full"
        self._in_flight: LaunchedStep | None = None  # launched, its tokens not read yet
        self._pinned: list[torch.Tensor | None] = [None, None]  # token buffers, alternating
        self.steps_ahead = 0  # steps launched while the previous one was in flight
        self.decode_steps = 0  # steps with a decode row (past its prompt)
        self.decode_steps_ahead = 0  # of those, launched while the previous one was in flight

    def _should_offload(self) -> bool:
        mode = self.config.offload
        return mode == "always" or (mode == "auto" and self.offload_cost.recompute_over_load > 1.0)

    # --- requests -----------------------------------------------------------

    @property
    def max_request_tokens(self) -> int:
        """Longest sequence one request may reach: the model's context and the whole KV pool."""
        return min(self.model_config.max_position, self.num_pages * self.config.page_size)

    def add_request(
        self, prompt: str | list[int], params: SamplingParams | None = None, chat: bool = False
    ) -> int:
        """Queue a request; returns its id. Raises ``RequestError`` (and emits a rejection) if it cannot run."""
        params = params or SamplingParams()
        rid = self._next_id
        self._next_id += 1
        try:
            if isinstance(prompt, str):
                text = (
                    self.codec.render_chat([{"role": "user", "content": prompt}])
                    if chat
                    else prompt
                )
                ids = self.codec.encode(text)
            else:
                ids = list(prompt)
                if any(not 0 <= t < self.model_config.vocab_size for t in ids):
                    raise RequestError("prompt token id out of the vocabulary's range")
            if not ids:
                raise RequestError("empty prompt")
            if len(ids) >= self.model_config.max_position:
                raise RequestError(
                    f"prompt of {len(ids)} tokens does not fit the model's context of {self.model_config.max_position}"
                )
            if len(ids) + 1 > self.num_pages * self.config.page_size:
                raise RequestError(
                    f"prompt of {len(ids)} tokens needs more than the whole KV budget "
                    f"({self.num_pages} pages x {self.config.page_size} tokens)"
                )
        except RequestError as exc:
            if self.bus.active:
                self.bus.emit(RequestRejected(now_ns(), self.step_count, rid, str(exc)))
            raise
        req = Request(
            request_id=rid,
            prompt_ids=ids,
            params=params,
            arrival_ns=now_ns(),
            prompt=prompt if isinstance(prompt, str) else "",
            max_len=self.max_request_tokens,
        )
        if not params.greedy:
            req.generator = torch.Generator().manual_seed(
                params.seed if params.seed is not None else rid
            )
        self.requests[rid] = req
        self.scheduler.add(req)
        if self.bus.active:
            self.bus.emit(
                RequestArrived(req.arrival_ns, self.step_count, rid, len(ids), params.max_tokens)
            )
        return rid

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None

    # --- stepping -----------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample; returns outputs of requests that got tokens.

        With async scheduling the step's tokens stay on the device and the outputs are
        those of the step before: this one was scheduled and launched first, from the
        in-flight step's tokens where ``Scheduler.schedule_ahead`` allows, else after
        reading them (the serial path)."""
        t0 = time.perf_counter()
        if self.step_count == 0 and self.bus.active:
            self._emit_memory_budget()
        self.runner.step = self.step_count
        self.runner.drain_timings()  # CUDA timings of earlier steps that have finished
        self.kv.set_step(self.step_count)
        outputs: list[RequestOutput] = []
        in_flight, self._in_flight = self._in_flight, None
        batch = None
        if in_flight is not None:
            if in_flight.tokens.on_device:
                batch = self.scheduler.schedule_ahead()
            if batch is None:
                outputs = self._resolve(in_flight)
                in_flight = None
        if batch is None:
            batch = self.scheduler.schedule()
        emit = self.bus.active
        if emit:
            batch.emit_changes(self.bus, self.step_count)
        launched = None
        prefill = 0
        if batch.requests:
            launched = self._launch(batch, in_flight)
            if in_flight is not None:  # the device runs this step while the host reads that one
                self.steps_ahead += 1
                outputs = self._resolve(in_flight)
            prefill = self._advance(batch)
            if batch.num_tokens > prefill:
                self.decode_steps += 1
                self.decode_steps_ahead += in_flight is not None
        if launched is not None:
            # Left in flight only while one of its requests may still take its token.
            if self.async_scheduling and any(
                r.status is not Status.FINISHED for r in launched.sampling
            ):
                self._in_flight = launched
            else:
                outputs.extend(self._resolve(launched))
        if emit:
            self._emit_step(
                len(batch.requests), prefill, batch.num_tokens - prefill, time.perf_counter() - t0
            )
        self.step_count += 1
        if not self.has_unfinished():
            self.runner.drain_timings(wait=True)  # idle now: report the last steps' timings
        return outputs

    def _launch(self, batch: ScheduledBatch, in_flight: LaunchedStep | None) -> LaunchedStep | None:
        """Stage the batch (rows after ``in_flight``'s tokens fed on the device), queue the
        forward and the sampling; nothing here waits for the device. None when no row
        samples (prefill chunks only)."""
        now = now_ns()
        emit = self.bus.active
        for req in batch.requests:
            if req.scheduled_ns is None:
                req.scheduled_ns = now
                if emit:
                    self.bus.emit(
                        RequestScheduled(now, self.step_count, req.request_id, req.num_cached)
                    )
        feed = None
        if in_flight is not None:
            mixed = batch.num_tokens != len(batch.requests)  # prefill chunks among the rows
            feed = feed_for(batch.requests, in_flight, batch.num_new if mixed else None)
        inputs = self.runner.prepare(batch.requests, batch.num_new, feed=feed)
        logits = self.runner.execute(inputs)
        sampling = inputs.sampling
        if not sampling:
            return None
        which = self.step_count % 2
        tokens = SampledTokens(
            logits,
            [r.params for r in sampling],
            [r.generator for r in sampling],
            self._pinned[which],
        )
        self._pinned[which] = tokens.pinned
        return LaunchedStep(sampling, tokens)

    def _advance(self, batch: ScheduledBatch) -> int:
        """Count the batch's tokens as computed and offer full pages to the prefix cache;
        returns the prefill tokens. A request the in-flight step's tokens just finished
        is skipped: its row ran for nothing and its pages are already freed."""
        emit = self.bus.active
        offer = self.kv.offer if self.kv.prefix is not None else None
        prefill = 0
        for req, n in zip(batch.requests, batch.num_new, strict=True):
            if req.status is Status.FINISHED:
                continue
            if req.num_computed < len(req.prompt_ids):  # in prefill
                prefill += n
                if emit and (
                    n < len(req.prompt_ids) - req.num_computed or req.num_computed > req.num_cached
                ):
                    self.bus.emit(
                        ChunkScheduled(
                            now_ns(), self.step_count, req.request_id, req.num_computed, n
                        )
                    )
            req.num_computed += n
            if offer is not None:  # no prefix cache: nothing to offer
                offer(req)
        return prefill

    def _resolve(self, launched: LaunchedStep) -> list[RequestOutput]:
        """Read a launched step's tokens and append them; a request that finished since
        (its previous token stopped it) drops its token: it was never emitted."""
        tokens = launched.tokens.tolist()
        return [
            self._append_token(req, tok)
            for req, tok in zip(launched.sampling, tokens, strict=True)
            if req.status is not Status.FINISHED
        ]

    def _append_token(self, req: Request, token: int) -> RequestOutput:
        out = req.output_ids
        out.append(token)
        self.total_output_tokens += 1
        if req.first_token_ns is None:
            req.first_token_ns = now = now_ns()  # only the first token needs the clock
            if self.bus.active:
                self.bus.emit(
                    FirstToken(now, self.step_count, req.request_id, (now - req.arrival_ns) / 1e9)
                )
        p = req.params
        reason = None
        cut = None
        if not p.ignore_eos and token in self.codec.eos_token_ids or token in p.stop_token_ids:
            reason = "stop"
        elif p.stop:
            text = self.codec.decode(req.output_ids)
            hits = [text.find(s) for s in p.stop if s in text]
            if hits:
                reason, cut = "stop", min(hits)
        n = len(out)
        if reason is None and (n >= p.max_tokens or len(req.prompt_ids) + n >= req.max_len):
            reason = "length"
        if reason is not None:
            text = self.codec.decode(out)
            req.text = text[:cut] if cut is not None else text
            self._finish(req, reason)
        return RequestOutput(
            req.request_id,
            req.prompt,
            req.text,
            out,
            req.finish_reason,
            reason is not None,
            [token],
            n,
        )

    def _finish(self, req: Request, reason: str) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finish_ns = now_ns()
        self.scheduler.finish(req)
        self.kv.release(req)
        if self.bus.active:
            ttft = (req.first_token_ns - req.arrival_ns) / 1e9 if req.first_token_ns else 0.0
            n = len(req.output_ids)
            tpot = (
                (req.finish_ns - req.first_token_ns) / 1e9 / (n - 1)
                if n > 1 and req.first_token_ns
                else 0.0
            )
            self.bus.emit(
                RequestFinished(
                    req.finish_ns,
                    self.step_count,
                    req.request_id,
                    len(req.prompt_ids),
                    n,
                    req.num_cached,
                    reason,
                    ttft,
                    tpot,
                )
            )

    def _page_map_due(self) -> bool:
        """Whether ``page_map_interval_s`` has passed since the last snapshot."""
        now = time.monotonic()
        if now - self._last_page_map_s < self.config.page_map_interval_s:
            return False
        self._last_page_map_s = now
        return True

    def _emit_step(self, batch_size: int, prefill: int, decode: int, seconds: float) -> None:
        pool = self.kv.pool
        tokens_held, pages_cached = self.kv.occupancy()
        if self.step_count % self.config.page_map_every == 0 and self._page_map_due():
            self.kv.emit_page_map()
        self.bus.emit(
            StepSummary(
                now_ns(),
                self.step_count,
                batch_size=batch_size,
                prefill_tokens=prefill,
                decode_tokens=decode,
                running=len(self.scheduler.running),
                waiting=len(self.scheduler.waiting),
                pages_total=pool.num_pages,
                pages_used=pool.num_used,
                pages_cached=pages_cached,
                pages_free=pool.num_free,
                page_size=pool.page_size,
                tokens_held=tokens_held,
                host_pages_used=self.kv.host_pages_used,
                duration_s=seconds,
            )
        )

    def _on_kernel(
        self, step: int, name: str, shape: str, seconds: float, flops: float, nbytes: float
    ) -> None:
        if self.bus.active:
            self.bus.emit(KernelTiming(now_ns(), step, name, shape, seconds, flops, nbytes))

    def _emit_memory_budget(self) -> None:
        b = self.budget
        self.bus.emit(
            MemoryBudgetMeasured(
                now_ns(),
                self.step_count,
                device=b.device,
                device_bytes=b.device_bytes,
                memory_fraction=b.memory_fraction,
                weights_bytes=b.weights_bytes,
                activation_bytes=b.activation_bytes,
                overhead_bytes=b.overhead_bytes,
                kv_bytes=self.storage.nbytes,
                activations_measured=b.activations_measured,
                overhead_measured=b.overhead_measured,
                predicted_kv_bytes=predicted_kv_bytes(
                    self.model_config, self.config.weights_dtype, b
                ),
            )
        )

    # --- convenience ----------------------------------------------------------

    def score(
        self,
        token_ids: list[int],
        chunk: int = 512,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits at every position of ``token_ids`` [n, vocab], computed through the paged cache.

        The sequence is fed in chunks, each attending to the K/V the previous
        chunks left in the pages, so this measures exactly what the cache (and
        its KV dtype) gives back: perplexity and KL evaluations use it.
        ``reduce`` maps each chunk's logits to what is kept (long sequences: the
        full [n, vocab] logits take n x 200 KB).
        """
        if self.has_unfinished():
            raise KvscopeError("score() needs an idle engine")
        if len(token_ids) > self.max_request_tokens:
            raise RequestError(
                f"{len(token_ids)} tokens exceed what one request may hold ({self.max_request_tokens})"
            )
        req = Request(
            -1,
            list(token_ids),
            SamplingParams(max_tokens=1),
            now_ns(),
            max_len=self.max_request_tokens,
        )
        parts = []
        try:
            while req.num_computed < len(token_ids):
                n = min(chunk, len(token_ids) - req.num_computed)
                self.kv.grow(req, req.num_computed + n)
                # Every new token's logits; a 1-token chunk may replay a decode graph.
                inputs = self.runner.prepare([req], [n], all_logits=True)
                logits = self.runner.execute(inputs)
                parts.append(logits if reduce is None else reduce(logits))
                req.num_computed += n
        finally:
            self.kv.release(req)
        return torch.cat(parts)

    def stream(self) -> Iterator[RequestOutput]:
        """Step until every queued request finishes, yielding each new token's output."""
        while self.has_unfinished():
            yield from self.step()

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        params: SamplingParams | None = None,
        chat: bool = False,
    ) -> list[RequestOutput]:
        """Run all prompts as one continuous batch; outputs in input order."""
        ids = [self.add_request(p, params, chat=chat) for p in prompts]
        final: dict[int, RequestOutput] = {}
        for out in self.stream():
            if out.finished:
                final[out.request_id] = out
        return [final[i] for i in ids]
