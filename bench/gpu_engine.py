"""The engine on one GPU: correctness against transformers, throughput at 8B shape, a recorded run.

1. Correctness: a random-initialised small Llama and a Qwen2 (QKV biases)
   built with transformers and saved as Hugging Face directories. kvscope on
   the device (fp32, TF32 off) runs 8 prompts of mixed length as one
   continuous batch, with prefix hits, chunked prefill and preemption all
   happening, with async scheduling on, and must give transformers' greedy
   tokens exactly; bf16 weights report teacher-forced top-1 agreement with
   the fp32 reference.
2. Throughput, same process: Llama-3-8B shape, dummy bf16 weights, prompt 512,
   64 new tokens, single stream and batches of 32 and 128, kvscope vs two
   transformers ``generate`` baselines (eager with its DynamicCache; a static
   cache with the forward under ``torch.compile``, reduce-overhead); model bandwidth utilisation of kvscope's decode
   steps (weight + KV bytes read per step / step time / the device-to-device
   copy bandwidth measured here), prefill TFLOP/s against the device's peak,
   the unified memory budget as measured next to ``kvscope calc``'s
   prediction, and tok/s with the recorder on over off (batch 32).
3. A recorded run of the chat workload scaled to the device (hundreds of
   requests, GPU sampler on), its database kept under 16 MiB.

Prints one table as it goes; writes ``gpu_engine.db`` and ``gpu_engine.json`` to
the folder given. ``--smoke`` runs every part on the CPU with tiny shapes (CI
keeps the script alive with it).

The GPU machine has torch, triton, transformers and nvidia-ml-py but not
sqlite-utils, which kvscope's database layer needs for part 3. Carry its
pure-Python packages from this checkout's virtualenv (``run`` tool ``carry``:
``.venv/lib/python3.11/site-packages/`` + ``sqlite_utils``, ``click``,
``click_default_group.py``, ``dateutil``, ``pluggy``, ``sqlite_fts4``,
``tabulate``): the script appends those folders to ``sys.path`` after the
machine's own packages, so the machine's torch always wins. Without them part
3 is skipped with a note and the rest still runs.

kvscope itself must be installed there (nothing is imported from the checkout's
folders): ``pip install -q --no-deps --no-build-isolation -e .`` first.

Run: ``pip install -q --no-deps --no-build-isolation -e . &&
PYTHONUNBUFFERED=1 python bench/gpu_engine.py OUT_DIR [--smoke]``
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import glob
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# After the machine's own packages (its torch wins): the carried pure-Python ones.
sys.path.extend(sorted(glob.glob(str(ROOT / ".venv/lib/python3*/site-packages"))))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from kvscope.app.progress import Progress  # noqa: E402
from kvscope.engine.device import preset_match, synchronize  # noqa: E402
from kvscope.engine.dummy import byte_codec, dummy_shell  # noqa: E402
from kvscope.engine.engine import Engine  # noqa: E402
from kvscope.engine.engine_config import EngineConfig  # noqa: E402
from kvscope.engine.events import (  # noqa: E402
    ChunkScheduled,
    EventBus,
    PrefixLookup,
    RequestPreempted,
    StepSummary,
)
from kvscope.engine.memory_budget import predicted_kv_bytes  # noqa: E402
from kvscope.engine.model_config import ModelConfig  # noqa: E402
from kvscope.engine.presets import model_preset  # noqa: E402
from kvscope.engine.sampler import SamplingParams  # noqa: E402

DB_LIMIT = 16 << 20


class Report:
    """One table, printed row by row as figures arrive, and the same figures as JSON."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.extra: dict = {}
        print(f"| {'part':<12} | {'what':<52} | {'value':>14} | {'note':<40} |")
        print(f"|{'-' * 14}|{'-' * 54}|{'-' * 16}|{'-' * 42}|")

    def add(self, part: str, what: str, value: float | str, note: str = "") -> None:
        self.rows.append({"part": part, "what": what, "value": value, "note": note})
        shown = f"{value:,.4g}" if isinstance(value, float) else str(value)
        print(f"| {part:<12} | {what:<52} | {shown:>14} | {note:<40} |", flush=True)


# --- shapes -----------------------------------------------------------------------------


def small_configs(smoke: bool) -> list[ModelConfig]:
    """The correctness models: a Llama with its own LM head and a tied-embedding Qwen2."""
    hidden, heads, layers = (64, 4, 2) if smoke else (256, 8, 4)
    base = ModelConfig(
        architecture="llama",
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_q_heads=heads,
        num_kv_heads=heads // 4,
        head_dim=hidden // heads,
        vocab_size=512,
        rope_theta=10000.0,
        max_position=1024,
        name="small-llama",
    )
    qwen = dataclasses.replace(
        base, architecture="qwen2", qkv_bias=True, tie_embeddings=True, name="small-qwen2"
    )
    return [base, qwen]


def throughput_config(smoke: bool) -> ModelConfig:
    llama8b = model_preset("llama3-8b")
    if not smoke:
        return llama8b
    return dataclasses.replace(
        llama8b,
        num_layers=2,
        hidden_size=128,
        intermediate_size=256,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=32,
        vocab_size=1024,
        name="llama3-8b-tiny",
    )


def hf_model(config: ModelConfig, dtype: torch.dtype, device: str, init_std: float = 0.02):
    """The transformers model of ``config``'s shape, randomly initialised on ``device``."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config
    from transformers.utils import logging

    logging.disable_progress_bar()

    cls = Qwen2Config if config.architecture == "qwen2" else LlamaConfig
    hf_config = cls(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_q_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.eval()


def save_hf_dir(model, config: ModelConfig, folder: Path) -> Path:
    """A Hugging Face directory kvscope loads: config, safetensors and a byte-level tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    byte_codec(config.vocab_size).tokenizer.save(str(folder / "tokenizer.json"))
    return folder


# --- 1. correctness ---------------------------------------------------------------------


def mixed_prompts(vocab: int, seed: int) -> list[list[int]]:
    """8 prompts of 5..300 tokens; four share a 64-token prefix (prefix-cache hits)."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(1, vocab, (64,), generator=g).tolist()
    prompts = []
    for i, n in enumerate((5, 300, 37, 120, 17, 210, 64, 90)):
        own = torch.randint(1, vocab, (n,), generator=g).tolist()
        prompts.append(shared + own if i % 2 else own)
    return prompts


def hf_greedy(model, prompts: list[list[int]], new: int, device: str) -> list[list[int]]:
    outs = []
    for p in prompts:
        ids = torch.tensor([p], device=device)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
            )
        outs.append(out[0, len(p) :].tolist())
    return outs


def correctness(report: Report, device: str, smoke: bool, workdir: Path) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    new = 24
    results = {}
    for i, config in enumerate(small_configs(smoke)):
        torch.manual_seed(i)
        model = hf_model(config, torch.float32, device, init_std=0.2)  # peaked logits: no ties
        folder = save_hf_dir(model, config, workdir / config.name)
        prompts = mixed_prompts(config.vocab_size, seed=i)
        reference = hf_greedy(model, prompts, new, device)

        bus = EventBus()
        seen = {"preempted": 0, "chunks": 0, "prefix_hit_tokens": 0}

        def count(event, seen=seen) -> None:
            if isinstance(event, RequestPreempted):
                seen["preempted"] += 1
            elif isinstance(event, ChunkScheduled):
                seen["chunks"] += 1
            elif isinstance(event, PrefixLookup):
                seen["prefix_hit_tokens"] += event.hit_tokens

        bus.subscribe(count)
        page_size = 16
        kv_tokens = 900  # less than the batch needs at once: preemption must happen
        per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
        engine = Engine(
            EngineConfig(
                model=str(folder),
                device=device,
                weights_dtype="fp32",
                kv_budget_bytes=kv_tokens * per_token,
                page_size=page_size,
                max_batched_tokens=128,  # prompts up to 364 tokens: chunked prefill
                max_num_seqs=8,
                async_scheduling="on",  # as served: the next step launched ahead of the tokens
            ),
            bus=bus,
        )
        params = SamplingParams(max_tokens=new, ignore_eos=True)
        got = [o.token_ids for o in engine.generate(prompts, params)]
        same = sum(a == b for a, b in zip(got, reference, strict=True))
        note = (
            f"preempt {seen['preempted']}, chunks {seen['chunks']}, "
            f"prefix hit {seen['prefix_hit_tokens']} tok, {engine.steps_ahead} steps ahead"
        )
        report.add("correctness", f"{config.name} fp32 greedy = transformers", f"{same}/8", note)
        ok = (
            same == len(prompts)
            and seen["preempted"] > 0
            and seen["chunks"] > 0
            and seen["prefix_hit_tokens"] > 0
        )

        # bf16 weights: teacher-forced top-1 agreement with the fp32 reference.
        # Graphs on: score's 1-token chunks replay them (score crashed there before).
        bf16 = Engine(EngineConfig(model=str(folder), device=device, weights_dtype="bf16"))
        agree = total = 0
        for p, ref in zip(prompts, reference, strict=True):
            seq = p + ref
            with torch.inference_mode():
                ref_logits = model(torch.tensor([seq], device=device)).logits[0]
            logits = bf16.score(seq)
            agree += int((logits.argmax(-1) == ref_logits.argmax(-1)).sum())
            total += len(seq)
        # One sequence token by token: every 1-token chunk replays a decode graph on CUDA.
        seq = prompts[0] + reference[0]
        by_token = bf16.score(seq, chunk=1).argmax(-1) == bf16.score(seq).argmax(-1)
        graph_score = float(by_token.float().mean())
        report.add(
            "correctness", f"{config.name} bf16 score by token = chunked", graph_score, "top-1"
        )
        report.add("correctness", f"{config.name} bf16 top-1 agreement", agree / total)
        results[config.name] = {
            "exact": same,
            "prompts": len(prompts),
            **seen,
            "bf16_top1": agree / total,
            "score_by_token_top1": graph_score,
            "ok": ok,
        }
        del engine, bf16, model
        free_memory(device)
    return results


# --- 2. throughput ----------------------------------------------------------------------


def free_memory(device: str) -> None:
    """Give the memory of deleted engines and models back before the next part sizes itself."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def dummy_engine(config: ModelConfig, engine_config: EngineConfig) -> Engine:
    """An engine over dummy weights of ``config`` (any shape, not only a preset's)."""
    return Engine(engine_config, loaded=dummy_shell(config))


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Device-to-device copy, bytes read + written per second (the MBU denominator)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() / min(times)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n, length), generator=g).tolist()


def kvscope_throughput(engine: Engine, prompts: list[list[int]], new: int) -> dict:
    """Tokens/s end to end, and the decode and prefill steps' own figures."""
    steps: list[StepSummary] = []
    unsubscribe = engine.bus.subscribe(
        lambda e: steps.append(e) if isinstance(e, StepSummary) else None
    )
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    ahead = engine.steps_ahead
    synchronize(engine.device)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    synchronize(engine.device)
    seconds = time.perf_counter() - t0
    unsubscribe()
    ahead = engine.steps_ahead - ahead
    tokens = sum(len(o.token_ids) for o in outs)
    decode = [s for s in steps if s.prefill_tokens == 0 and s.decode_tokens > 0]
    prefill = [s for s in steps if s.prefill_tokens > 0]
    return {
        "tok_s": tokens / seconds,
        "seconds": seconds,
        "decode_step_s": statistics.median(s.duration_s for s in decode) if decode else None,
        "decode_batch": statistics.median(s.decode_tokens for s in decode) if decode else 0,
        "prefill_tokens": sum(s.prefill_tokens for s in prefill),
        "prefill_s": sum(s.duration_s for s in prefill),
        # Steps launched before the previous step's tokens were read (async scheduling);
        # with it, a decode step's duration is mostly the wait for the one before it.
        "steps_ahead": ahead,
        "decode_steps": len(decode),
    }


def recording_ratio(
    engine: Engine, prompts: list[list[int]], new: int, folder: Path
) -> float | None:
    """tok/s with the recorder subscribed over tok/s with nothing on the bus (one warm
    engine, same prompts, back to back); None without sqlite-utils."""
    try:
        from kvscope.profiler.recorder import Recorder
    except ImportError:
        return None
    params = SamplingParams(max_tokens=new, ignore_eos=True)

    def tok_s() -> float:
        synchronize(engine.device)
        t0 = time.perf_counter()
        tokens = sum(len(o.token_ids) for o in engine.generate(prompts, params))
        synchronize(engine.device)
        return tokens / (time.perf_counter() - t0)

    off = tok_s()
    db = folder / "recording_overhead.db"
    recorder = Recorder(db, {"purpose": "recording overhead"}, model=engine.loaded.source)
    unsubscribe = engine.bus.subscribe(recorder.on_event)
    recorder.start()
    on = tok_s()
    unsubscribe()
    recorder.finish()
    db.unlink()
    return on / off


def hf_throughput(
    model, prompts: list[list[int]], new: int, device: str, static: bool = False
) -> float:
    """transformers ``generate`` tok/s: eager with its DynamicCache, or (``static``) with a
    static KV cache and the forward compiled; a warm-up on the same shapes first."""
    ids = torch.tensor(prompts, device=device)
    kwargs = {"cache_implementation": "static"} if static else {}

    def generate():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            **kwargs,
        )

    with torch.inference_mode():
        generate()  # warm-up: the same shapes (compiles, for the static cache)
        synchronize(device)
        t0 = time.perf_counter()
        out = generate()
        synchronize(device)
    return (out.shape[1] - ids.shape[1]) * len(prompts) / (time.perf_counter() - t0)


def compiled(model, device: str):
    """``model`` with its forward under ``torch.compile`` (CUDA graphs via reduce-overhead on
    a GPU; the CPU smoke run uses the eager backend: no C compiler, and nothing to time)."""
    if device.startswith("cuda"):
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    else:
        model.forward = torch.compile(model.forward, backend="eager")
    return model


def throughput(report: Report, device: str, smoke: bool, out: Path) -> dict:
    config = throughput_config(smoke)
    prompt_len, new = (32, 8) if smoke else (512, 64)
    batches = (1, 4, 8) if smoke else (1, 32, 128)
    bandwidth = copy_bandwidth(device, (64 << 20) if smoke else (2 << 30))
    peak, fallback_note = preset_match(device)
    report.add("throughput", "device copy bandwidth (read + write)", bandwidth / 1e9, "GB/s")
    report.add("throughput", "device preset (peaks)", peak.name, fallback_note or "")
    engine_config = EngineConfig(
        model=f"preset:{config.name}",
        load_format="dummy",
        device=device,
        weights_dtype="bf16",
        kv_dtype="bf16",
        kv_budget_bytes=(64 << 20) if smoke else (16 << 30),
        max_num_seqs=max(batches),
        max_batched_tokens=8192,
        prefix_cache=False,
        async_scheduling="on",
    )
    t0 = time.perf_counter()
    engine = dummy_engine(config, engine_config)
    report.add(
        "throughput",
        f"kvscope {config.name} dummy bf16 start-up",
        time.perf_counter() - t0,
        "s (weights, budget, graphs)",
    )
    budget = engine.budget
    measured_kv = budget.kv_bytes
    predicted = predicted_kv_bytes(config, "bf16", budget)
    gib = 2**30
    for what, value in (
        ("memory: weights", budget.weights_bytes),
        ("memory: activations (peak at max-batched-tokens)", budget.activation_bytes),
        ("memory: framework overhead", budget.overhead_bytes),
        ("memory: KV cache at memory-fraction 0.9", measured_kv),
        ("memory: KV cache predicted by kvscope calc", predicted),
    ):
        report.add("memory", what, value / gib, "GiB")
    # Bytes a decode step must read: every weight once, except the embedding table, of
    # which a step reads one row per request (unless it doubles as the LM head).
    decoder = engine.model
    step_weights = decoder.weight_bytes
    if not config.tie_embeddings:
        step_weights -= decoder.embed.numel() * decoder.embed.element_size()
    rows = {}
    for batch in batches:
        prompts = random_prompts(batch, prompt_len, config.vocab_size, seed=batch)
        # Warm-up on the full prompt set: every chunk and decode shape of the timed run
        # (each prefill q_class and decode bucket) compiles and tunes here, not in it.
        kvscope_throughput(engine, prompts, 4)
        got = kvscope_throughput(engine, prompts, new)
        step = got["decode_step_s"]
        kv_read = got["decode_batch"] * (prompt_len + new / 2) * engine.storage.bytes_per_token
        mbu = (step_weights + kv_read) / step / bandwidth if step else None
        report.add("throughput", f"kvscope tok/s, batch {batch}", got["tok_s"])
        report.add(
            "throughput",
            f"kvscope decode steps launched ahead, batch {batch}",
            f"{got['steps_ahead']}/{got['decode_steps']}",
            "async scheduling",
        )
        if mbu is not None:
            report.add("throughput", f"kvscope decode step, batch {batch}", step * 1e3, "ms")
            report.add("throughput", f"kvscope model bandwidth utilisation, batch {batch}", mbu)
        if got["prefill_s"]:
            tflops = 2 * config.num_params * got["prefill_tokens"] / got["prefill_s"] / 1e12
            report.add(
                "throughput",
                f"kvscope prefill TFLOP/s, batch {batch}",
                tflops,
                f"{tflops / peak.fp16_tflops:.0%} of {peak.name} bf16 peak",
            )
        rows[batch] = {**got, "mbu": mbu}
        if batch == batches[1]:
            ratio = recording_ratio(engine, prompts, new, out)
            rows[batch]["recording_on_over_off"] = ratio
            if ratio is not None:
                report.add("throughput", f"recording on / off tok/s, batch {batch}", ratio)
    del engine, decoder
    free_memory(device)

    torch.manual_seed(0)
    model = hf_model(config, torch.bfloat16, device)
    for label, static in (("eager", False), ("static+compile", True)):
        if static:
            model = compiled(model, device)
        for batch in batches:
            prompts = random_prompts(batch, prompt_len, config.vocab_size, seed=batch)
            hf = hf_throughput(model, prompts, new, device, static=static)
            key = "transformers_tok_s" if not static else "transformers_static_compile_tok_s"
            rows[batch][key] = hf
            report.add("throughput", f"transformers {label} tok/s, batch {batch}", hf)
            report.add(
                "throughput",
                f"kvscope / transformers {label}, batch {batch}",
                rows[batch]["tok_s"] / hf,
                "x",
            )
    del model
    free_memory(device)
    bound = bandwidth / step_weights  # tokens/s if a step only read the weights, at copy speed
    report.add("throughput", "single-stream weight-bandwidth bound", bound, "tok/s")
    return {
        "model": config.name,
        "copy_bandwidth_Bps": bandwidth,
        "step_weight_bytes": step_weights,
        "single_stream_bound_tok_s": bound,
        "batches": rows,
        "memory_budget": {**dataclasses.asdict(budget), "kv_bytes": measured_kv},
        "predicted_kv_bytes": predicted,
        "device_preset": peak.name,
    }


# --- 3. a recorded run --------------------------------------------------------------------


def recorded_run(report: Report, device: str, smoke: bool, out: Path) -> dict:
    try:
        import sqlite_utils  # noqa: F401
    except ImportError:
        report.add("recorded run", "skipped: sqlite-utils is not importable", "-", "see docstring")
        return {"skipped": "sqlite-utils missing"}
    from kvscope.app.commands.run import _config_record
    from kvscope.app.run_job import drive
    from kvscope.app.workloads import builtin
    from kvscope.db.memory_budget import USER_BUDGET
    from kvscope.profiler.gpu_sampler import GpuSampler
    from kvscope.profiler.recorder import Recorder

    config = throughput_config(smoke)
    requests, rate = (24, 200.0) if smoke else (512, 256.0)
    engine_config = EngineConfig(
        model=f"preset:{config.name}",
        load_format="dummy",
        device=device,
        weights_dtype="bf16",
        kv_dtype="bf16",
        kv_budget_bytes=(2 << 20) if smoke else None,  # the GPU: memory fraction 0.9, measured
        max_num_seqs=16 if smoke else 128,
        page_map_every=4 if smoke else 16,
        async_scheduling="on",
    )
    engine = dummy_engine(config, engine_config)
    db = out / "gpu_engine.db"
    db.unlink(missing_ok=True)
    # The run's record as `kvscope run` writes it, so every front end reads it the same way.
    workload = argparse.Namespace(
        workload="chat",
        requests=requests,
        rate=rate,
        seed=0,
        ignore_eos=False,
        kv_budget_sized=False,
        kv_budget_source=USER_BUDGET,  # fixed by this script in smoke mode, as --kv-budget would
    )
    recorder = Recorder(db, _config_record(workload, engine), model=engine.loaded.source)
    unsubscribe = engine.bus.subscribe(recorder.on_event)
    recorder.start()
    sampler = GpuSampler(engine.bus, interval_s=0.25, current_step=lambda: engine.step_count)
    sampling = sampler.start()
    result = drive(engine, builtin("chat", requests, rate, seed=0), threading.Event())
    if sampling:
        sampler.stop()
    unsubscribe()
    summary = recorder.finish("complete")
    size = db.stat().st_size
    report.add("recorded run", f"chat x {requests}: tokens/s", summary.tokens_per_s or 0.0)
    report.add("recorded run", "pages in the pool", engine.num_pages)
    report.add("recorded run", "prefix hit rate", summary.prefix_hit_rate or 0.0)
    report.add("recorded run", "dropped events", summary.dropped_events)
    report.add("recorded run", "GPU sampler on", "yes" if sampling else "no (no NVML GPU)")
    report.add("recorded run", "database size", size / 2**20, "MiB (limit 16)")
    return {
        **result,
        "summary": dataclasses.asdict(summary),
        "db_bytes": size,
        "gpu_sampler": sampling,
        "pages": engine.num_pages,
        "ok": size <= DB_LIMIT and summary.dropped_events == 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder for gpu_engine.db and gpu_engine.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    args = ap.parse_args(argv)
    device = args.device or ("cpu" if args.smoke else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_engine: error: no CUDA device here; use --smoke", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    report = Report()
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    report.add("setup", "device", name, f"torch {torch.__version__}")
    figures: dict = {"device": name, "smoke": args.smoke}
    # One unit per part (they differ in length: the ETA is a rough one).
    progress = Progress(3, "parts")
    with tempfile.TemporaryDirectory() as tmp:
        figures["correctness"] = correctness(report, device, args.smoke, Path(tmp))
    progress.advance()
    figures["throughput"] = throughput(report, device, args.smoke, args.out)
    progress.advance()
    figures["recorded_run"] = recorded_run(report, device, args.smoke, args.out)
    progress.advance()
    figures["seconds"] = time.perf_counter() - began
    report.add("setup", "wall time", figures["seconds"], "s")
    figures["table"] = report.rows
    (args.out / "gpu_engine.json").write_text(json.dumps(figures, indent=1, default=str))
    ok = all(r["ok"] for r in figures["correctness"].values())
    ok = ok and figures["recorded_run"].get("ok", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
