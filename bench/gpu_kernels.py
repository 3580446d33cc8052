"""GPU check of the Triton kernels: correctness against torch first, then speed.

Every shape is checked against torch before it is timed; the table then sets
each row against its baseline, measured in the same run, and against issue
14's goals:

- prefill varlen (TFLOP/s) against torch SDPA on the same shapes, at least
  0.90: equal sequences (including one of 16384 tokens), a ragged
  serving-like batch (lengths 64 to 4096 in one call, SDPA run per sequence),
  and head dims 80 and 96;
- paged prefill reading a cached first half through the page table, at
  least 0.85 of SDPA over the whole sequences;
- decode (GB/s) against a measured device-to-device copy, at least 0.85 for
  fp16/bf16 pages, including many short sequences and small heads;
- quantized decode against fp16 decode over the same tokens: time ratios at
  most 0.6 (fp8), 0.65 (int8), 0.4 (int4).

Exits 1 if a check fails or a goal is missed. The first run on a machine also
autotunes every kernel variant (a few minutes); Triton caches the choices on
disk, so later runs only time. ``--smoke`` runs tiny shapes on the CPU under
``TRITON_INTERPRET=1`` to exercise the script where there is no GPU (no row
carries a goal there: the interpreter's speed means nothing).

Run: ``.venv/bin/python bench/gpu_kernels.py [--smoke]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PREFILL_GOAL = 0.90
PAGED_PREFILL_GOAL = 0.85
DECODE_GOAL = 0.85
# time(format) / time(fp16) on the same tokens, at most
QUANTIZED_TIME_GOAL = {"fp8_e4m3": 0.60, "fp8_e5m2": 0.60, "int8": 0.65, "int4": 0.40}
CHECK_TOLERANCE = 2e-2
FORMAT_OF = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
DTYPE_OF = {name: dtype for dtype, name in FORMAT_OF.items()}


@dataclass
class Row:
    kind: str
    shape: str
    ms: float
    achieved: float  # TFLOP/s (prefill), GB/s (decode), or ms (a time ratio's numerator)
    baseline: float
    unit: str
    goal: float | None  # the least ratio that meets the goal, or None (information only)
    error: float  # max |out - torch| / max |torch|
    config: str  # the autotuned config that ran

    @property
    def ratio(self) -> float:
        return self.achieved / self.baseline


@dataclass
class TimeRatio:
    """A quantized decode row's time against fp16 on the same shape: lower is better."""

    shape: str
    kv_dtype: str
    ms: float
    fp16_ms: float
    goal: float | None

    @property
    def ratio(self) -> float:
        return self.ms / self.fp16_ms


def timed_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median milliseconds per call, L2 flushed before each call on a GPU."""
    fn()  # compile, autotune and warm up
    if device.type != "cuda":
        samples = []
        for _ in range(reps):
            began = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - began) * 1e3)
        return statistics.median(samples)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    samples = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).abs().max() / ref.abs().max()).item()


def copy_gb_per_s(device: torch.device, nbytes: int, reps: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), device, reps)
    return 2 * nbytes / (ms / 1e3) / 1e9


def chosen_config(kernel: object) -> str:
    """The config the autotuner ran last, as ``M128 N64 w8 s3``."""
    config = getattr(kernel, "best_config", None)
    if config is None:
        return "-"
    tiles = " ".join(f"{key.removeprefix('BLOCK_')}{value}" for key, value in config.kwargs.items())
    return f"{tiles} w{config.num_warps} s{config.num_stages}"


def causal_flops(lengths: list[int], num_q_heads: int, head_dim: int) -> float:
    from kvscope.kernels.backend import visible_pairs

    return 4.0 * visible_pairs(lengths, lengths, True) * num_q_heads * head_dim


def prefill_rows(shapes: list[tuple], device: torch.device, reps: int) -> list[Row]:
    """Equal-length sequences: one varlen call, then the second halves over a cached prefix."""
    from kvscope.kernels import AttentionMetadata, KVPages, flash_attention_varlen, paged_attention
    from kvscope.kernels import triton_prefill as tp
    from kvscope.kernels.backend import visible_pairs

    rows = []
    for batch, seq, num_q_heads, num_kv_heads, head_dim, dtype in shapes:
        group = num_q_heads // num_kv_heads
        q = torch.randn(batch, num_q_heads, seq, head_dim, device=device, dtype=dtype)
        k = torch.randn(batch, num_kv_heads, seq, head_dim, device=device, dtype=dtype)
        v = torch.randn_like(k)
        # SDPA gets its fastest layout: heads expanded, contiguous [B, H, S, D].
        k_rep, v_rep = (x.repeat_interleave(group, dim=1).contiguous() for x in (k, v))

        def sdpa(q=q, k_rep=k_rep, v_rep=v_rep) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True)

        flat = [
            x.transpose(1, 2).reshape(batch * seq, -1, head_dim).contiguous() for x in (q, k, v)
        ]
        cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device)

        def ours(flat=flat, cu=cu, seq=seq) -> torch.Tensor:
            return flash_attention_varlen(*flat, cu, cu, True, backend="triton", max_seqlen_q=seq)

        want = sdpa().transpose(1, 2).reshape(batch * seq, num_q_heads, head_dim)
        flops = causal_flops([seq] * batch, num_q_heads, head_dim)
        sdpa_tflops = flops / (timed_ms(sdpa, device, reps) / 1e3) / 1e12
        label = f"B={batch} S={seq} H={num_q_heads}/{num_kv_heads} D={head_dim} {FORMAT_OF[dtype]}"
        error = rel_error(ours(), want)
        ms = timed_ms(ours, device, reps)
        rows.append(
            Row(
                "prefill varlen", label, ms, flops / (ms / 1e3) / 1e12, sdpa_tflops, "TFLOP/s",
                PREFILL_GOAL, error, chosen_config(tp._prefill_kernel),
            )
        )  # fmt: skip

        # The same queries as the last half of each sequence, the first half a cached prefix.
        page_size = 16
        pages_per_seq = seq // page_size
        num_pages = batch * pages_per_seq
        store = KVPages.allocate(
            num_pages, page_size, num_kv_heads, head_dim, FORMAT_OF[dtype], device
        )
        store.write(torch.arange(batch * seq, device=device), flat[1], flat[2])
        tables = [list(range(b * pages_per_seq, (b + 1) * pages_per_seq)) for b in range(batch)]
        half = seq // 2
        meta = AttentionMetadata.build(tables, [half] * batch, [seq] * batch, page_size, device)
        new_q = (
            flat[0]
            .view(batch, seq, num_q_heads, head_dim)[:, half:]
            .reshape(-1, num_q_heads, head_dim)
        )

        def paged(new_q=new_q, store=store, meta=meta) -> torch.Tensor:
            return paged_attention(new_q, store.data, meta, "triton")

        want_half = want.view(batch, seq, num_q_heads, head_dim)[:, half:].reshape_as(new_q)
        paged_flops = (
            4.0 * visible_pairs([half] * batch, [seq] * batch, True) * num_q_heads * head_dim
        )
        error = rel_error(paged(), want_half)
        ms = timed_ms(paged, device, reps)
        rows.append(
            Row(
                "prefill paged, half cached", label, ms, paged_flops / (ms / 1e3) / 1e12,
                sdpa_tflops, "TFLOP/s", PAGED_PREFILL_GOAL, error,
                chosen_config(tp._prefill_kernel),
            )
        )  # fmt: skip
    return rows


def ragged_lengths(count: int, shortest: int, longest: int) -> list[int]:
    """Serving-like prompt lengths, log-uniform between the two ends (both included)."""
    generator = torch.Generator().manual_seed(14)
    spread = torch.rand(count - 2, generator=generator) * torch.log2(
        torch.tensor(longest / shortest)
    )
    middle = (shortest * 2**spread).round().int().tolist()
    return [shortest, *middle, longest]


def ragged_rows(shapes: list[tuple], device: torch.device, reps: int) -> list[Row]:
    """A mixed-length batch in one varlen call against SDPA run on each sequence."""
    from kvscope.kernels import flash_attention_varlen
    from kvscope.kernels import triton_prefill as tp

    rows = []
    for lengths, num_q_heads, num_kv_heads, head_dim, dtype in shapes:
        group = num_q_heads // num_kv_heads
        total = sum(lengths)
        q = torch.randn(total, num_q_heads, head_dim, device=device, dtype=dtype)
        k = torch.randn(total, num_kv_heads, head_dim, device=device, dtype=dtype)
        v = torch.randn_like(k)
        bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        # Per sequence in SDPA's fastest layout, built before timing: [1, H, L, D].
        per_seq = [
            (
                q[a:b].transpose(0, 1)[None].contiguous(),
                k[a:b].repeat_interleave(group, dim=1).transpose(0, 1)[None].contiguous(),
                v[a:b].repeat_interleave(group, dim=1).transpose(0, 1)[None].contiguous(),
            )
            for a, b in zip(bounds, bounds[1:], strict=False)
        ]

        def sdpa(per_seq=per_seq) -> list[torch.Tensor]:
            return [F.scaled_dot_product_attention(*x, is_causal=True) for x in per_seq]

        cu = torch.tensor(bounds, dtype=torch.int32, device=device)
        longest = max(lengths)

        def ours(q=q, k=k, v=v, cu=cu, longest=longest) -> torch.Tensor:
            return flash_attention_varlen(
                q, k, v, cu, cu, True, backend="triton", max_seqlen_q=longest
            )

        want = torch.cat([o[0].transpose(0, 1) for o in sdpa()])
        flops = causal_flops(lengths, num_q_heads, head_dim)
        sdpa_tflops = flops / (timed_ms(sdpa, device, reps) / 1e3) / 1e12
        error = rel_error(ours(), want)
        ms = timed_ms(ours, device, reps)
        label = (
            f"{len(lengths)} seqs {min(lengths)}..{max(lengths)} ({total} tok) "
            f"H={num_q_heads}/{num_kv_heads} D={head_dim} {FORMAT_OF[dtype]}"
        )
        rows.append(
            Row(
                "prefill ragged vs SDPA/seq", label, ms, flops / (ms / 1e3) / 1e12, sdpa_tflops,
                "TFLOP/s", PREFILL_GOAL, error, chosen_config(tp._prefill_kernel),
            )
        )  # fmt: skip
    return rows


def decode_rows(shapes: list[tuple], device: torch.device, reps: int, copy_gbs: float) -> list[Row]:
    from kvscope.kernels import AttentionMetadata, KVPages, paged_attention
    from kvscope.kernels import triton_decode as td

    rows = []
    for batch, context, num_q_heads, num_kv_heads, head_dim, kv_dtype in shapes:
        page_size = 16
        pages_per_seq = context // page_size
        num_pages = batch * pages_per_seq
        store = KVPages.allocate(num_pages, page_size, num_kv_heads, head_dim, kv_dtype, device)
        chunk = 1 << 16  # write in slices: a full fp32 copy of the pool may not fit beside it
        for start in range(0, num_pages * page_size, chunk):
            slots = torch.arange(start, min(start + chunk, num_pages * page_size), device=device)
            kv = torch.randn(2, len(slots), num_kv_heads, head_dim, device=device)
            store.write(slots, kv[0], kv[1])
        order = torch.randperm(num_pages).tolist()  # scattered pages, as after churn
        tables = [order[b * pages_per_seq : (b + 1) * pages_per_seq] for b in range(batch)]
        meta = AttentionMetadata.build(tables, [1] * batch, [context] * batch, page_size, device)
        q_dtype = DTYPE_OF.get(kv_dtype, torch.float16)
        q = torch.randn(batch, num_q_heads, head_dim, device=device, dtype=q_dtype)
        reports: list[tuple] = []

        def ours(on_kernel=None, q=q, store=store, meta=meta, kv_dtype=kv_dtype) -> torch.Tensor:
            return paged_attention(
                q, store.data, meta, "triton", kv_dtype=kv_dtype, scales=store.scales,
                on_kernel=on_kernel,
            )  # fmt: skip

        want = paged_attention(q, store.data, meta, "torch", kv_dtype=kv_dtype, scales=store.scales)
        # One reported call for the bytes moved; the timed calls run without the callback.
        got = ours(lambda *event, sink=reports: sink.append(event))
        error = rel_error(got, want)
        ms = timed_ms(ours, device, reps)
        label = f"B={batch} ctx={context} H={num_q_heads}/{num_kv_heads} D={head_dim} {kv_dtype}"
        gbs = reports[0][4] / (ms / 1e3) / 1e9
        goal = DECODE_GOAL if kv_dtype in ("fp16", "bf16") else None
        config = chosen_config(td._decode_split_kernel)
        rows.append(Row("decode paged", label, ms, gbs, copy_gbs, "GB/s", goal, error, config))
    return rows


def time_ratios(rows: list[Row], with_goals: bool) -> list[TimeRatio]:
    """Each quantized decode row against the fp16 row of the same shape."""
    decode = [r for r in rows if r.kind == "decode paged"]
    fp16_ms = {r.shape.removesuffix(" fp16"): r.ms for r in decode if r.shape.endswith(" fp16")}
    ratios = []
    for r in decode:
        shape, kv_dtype = r.shape.rsplit(" ", 1)
        if kv_dtype in QUANTIZED_TIME_GOAL and shape in fp16_ms:
            goal = QUANTIZED_TIME_GOAL[kv_dtype] if with_goals else None
            ratios.append(TimeRatio(shape, kv_dtype, r.ms, fp16_ms[shape], goal))
    return ratios


def print_tables(name: str, copy_gbs: float, rows: list[Row], ratios: list[TimeRatio]) -> bool:
    """Print both tables; whether every check passed and every goal was met."""
    print(f"{name}; device-to-device copy {copy_gbs:.0f} GB/s (read + write)")
    print(
        f"{'kernel':<27} {'shape':<52} {'ms':>8} {'achieved':>16} {'baseline':>16} "
        f"{'ratio':>6} {'goal':>5} {'err':>8}  {'config':<17} verdict"
    )
    ok = True
    for r in rows:
        ok_check = r.error < CHECK_TOLERANCE
        ok_goal = r.goal is None or r.ratio >= r.goal
        ok &= ok_check and ok_goal
        if not ok_check:
            verdict = "CHECK FAILED"
        elif r.goal is not None:
            verdict = "goal met" if ok_goal else "GOAL MISSED"
        else:
            verdict = "info"
        goal = "-" if r.goal is None else f"{r.goal:.2f}"
        print(
            f"{r.kind:<27} {r.shape:<52} {r.ms:>8.3f} {r.achieved:>8.1f} {r.unit:<7} "
            f"{r.baseline:>8.1f} {r.unit:<7} {r.ratio:>6.2f} {goal:>5} {r.error:>8.1e}  "
            f"{r.config:<17} {verdict}"
        )
    print()
    print("quantized decode, time against fp16 on the same tokens (lower is better)")
    print(f"{'shape':<40} {'format':<9} {'ms':>8} {'fp16 ms':>8} {'ratio':>6} {'goal':>6}  verdict")
    for t in ratios:
        ok_goal = t.goal is None or t.ratio <= t.goal
        ok &= ok_goal
        verdict = "info" if t.goal is None else ("goal met" if ok_goal else "GOAL MISSED")
        goal = "-" if t.goal is None else f"<={t.goal:.2f}"
        print(
            f"{t.shape:<40} {t.kv_dtype:<9} {t.ms:>8.3f} {t.fp16_ms:>8.3f} {t.ratio:>6.2f} "
            f"{goal:>6}  {verdict}"
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = parser.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        device, reps, copy_bytes = torch.device("cpu"), 1, 1 << 24
        prefill_shapes = [(2, 64, 4, 2, 64, torch.float16), (1, 32, 2, 2, 80, torch.bfloat16)]
        ragged_shapes = [(ragged_lengths(4, 8, 48), 4, 2, 64, torch.float16)]
        decode_shapes = [
            (2, 128, 4, 2, 64, kv_dtype) for kv_dtype in ("fp16", "fp8_e4m3", "int8", "int4")
        ] + [(2, 64, 2, 2, 96, "bf16")]
    elif not torch.cuda.is_available():
        print(
            f"gpu_kernels: no CUDA device (torch {torch.__version__}); this benchmark needs an "
            "NVIDIA GPU, or --smoke to check the script on the CPU interpreter",
            file=sys.stderr,
        )
        return 1
    else:
        device, reps, copy_bytes = torch.device("cuda"), 20, 1 << 30
        prefill_shapes = [
            (2, 4096, 32, 8, 128, torch.float16),
            (2, 4096, 32, 8, 128, torch.bfloat16),
            (8, 2048, 9, 3, 64, torch.float16),  # SmolLM2-135M heads
            (1, 16384, 32, 8, 128, torch.float16),  # one long prompt
            (4, 2048, 32, 32, 96, torch.float16),  # Phi-3-mini heads
            (4, 2048, 32, 32, 80, torch.float16),  # Phi-2 heads
        ]
        ragged_shapes = [
            (ragged_lengths(16, 64, 4096), 32, 8, 128, dtype)
            for dtype in (torch.float16, torch.bfloat16)
        ]
        quantized = [
            (batch, context, hq, hkv, d, kv_dtype)
            for batch, context, hq, hkv, d in ((8, 32768, 32, 8, 128), (64, 4096, 9, 3, 64))
            for kv_dtype in ("fp16", "fp8_e4m3", "int8", "int4")
        ]
        decode_shapes = [
            *quantized,
            (32, 8192, 32, 8, 128, "fp16"),
            (32, 8192, 32, 8, 128, "bf16"),
            (128, 2048, 32, 8, 128, "fp16"),  # many short sequences
            (128, 2048, 9, 3, 64, "fp16"),
            (16, 4096, 32, 32, 96, "fp16"),
        ]
    # Imported here, beside the kernels (the functions above import them late too).
    from kvscope.app.progress import Progress

    torch.manual_seed(0)
    began = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"
    copy_gbs = copy_gb_per_s(device, copy_bytes, reps)
    # One unit per shape: each is checked against torch, then timed.
    progress = Progress(len(prefill_shapes) + len(ragged_shapes) + len(decode_shapes), "shapes")
    rows = []
    for shape in prefill_shapes:
        rows += prefill_rows([shape], device, reps)
        progress.advance()
    for shape in ragged_shapes:
        rows += ragged_rows([shape], device, reps)
        progress.advance()
    for shape in decode_shapes:
        rows += decode_rows([shape], device, reps, copy_gbs)
        progress.advance()
    if device.type != "cuda":
        for r in rows:
            r.goal = None
    ok = print_tables(name, copy_gbs, rows, time_ratios(rows, with_goals=device.type == "cuda"))
    print(
        f"baselines: prefill = torch SDPA (per sequence for ragged batches), decode = copy "
        f"bandwidth; {time.perf_counter() - began:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
