"""GPU check of the Triton kernels: correctness against torch first, then speed.

Prefill: TFLOP/s of the varlen FlashAttention-2 kernel (and of the same kernel
reading a cached prefix through the page table) against torch SDPA on the same
shapes; goal: at least 70% of SDPA. Decode: GB/s of the split-K paged kernel
against a measured device-to-device copy (bytes read + written per second);
goal: at least 70% at long context. Every shape is checked against torch
before it is timed. Prints a table; exits 1 if a check fails or a goal is
missed. Sized to build, check and time in well under 5 minutes on an
H100/H200. ``--smoke`` runs tiny shapes on the CPU under ``TRITON_INTERPRET=1``
to exercise the script itself where there is no GPU.

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

GOAL = 0.70
FORMAT_OF = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass
class Row:
    kind: str
    shape: str
    ms: float
    achieved: float  # TFLOP/s (prefill) or GB/s (decode)
    baseline: float
    unit: str
    goal: bool  # whether GOAL applies to this row
    error: float  # max |out - torch| / max |torch|

    @property
    def ratio(self) -> float:
        return self.achieved / self.baseline


def timed_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median milliseconds per call, L2 flushed before each call on a GPU."""
    fn()  # compile and warm up
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


def prefill_rows(shapes: list[tuple], device: torch.device, reps: int) -> list[Row]:
    from kernels import AttentionMetadata, KVPages, flash_attention_varlen, paged_attention
    from kernels.backend import visible_pairs

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
        flops = 4.0 * visible_pairs([seq] * batch, [seq] * batch, True) * num_q_heads * head_dim
        sdpa_tflops = flops / (timed_ms(sdpa, device, reps) / 1e3) / 1e12
        label = f"B={batch} S={seq} H={num_q_heads}/{num_kv_heads} D={head_dim} {FORMAT_OF[dtype]}"
        error = rel_error(ours(), want)
        ms = timed_ms(ours, device, reps)
        tflops = flops / (ms / 1e3) / 1e12
        goal = device.type == "cuda"  # the interpreter's speed means nothing
        rows.append(Row("prefill varlen", label, ms, tflops, sdpa_tflops, "TFLOP/s", goal, error))

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
                sdpa_tflops, "TFLOP/s", False, error,
            )
        )  # fmt: skip
    return rows


def decode_rows(shapes: list[tuple], device: torch.device, reps: int, copy_gbs: float) -> list[Row]:
    from kernels import AttentionMetadata, KVPages, paged_attention

    rows = []
    for batch, context, num_q_heads, num_kv_heads, head_dim, kv_format, goal in shapes:
        page_size = 16
        pages_per_seq = context // page_size
        num_pages = batch * pages_per_seq
        store = KVPages.allocate(num_pages, page_size, num_kv_heads, head_dim, kv_format, device)
        chunk = 1 << 16  # write in slices: a full fp32 copy of the pool may not fit beside it
        for start in range(0, num_pages * page_size, chunk):
            slots = torch.arange(start, min(start + chunk, num_pages * page_size), device=device)
            kv = torch.randn(2, len(slots), num_kv_heads, head_dim, device=device)
            store.write(slots, kv[0], kv[1])
        order = torch.randperm(num_pages).tolist()  # scattered pages, as after churn
        tables = [order[b * pages_per_seq : (b + 1) * pages_per_seq] for b in range(batch)]
        meta = AttentionMetadata.build(tables, [1] * batch, [context] * batch, page_size, device)
        q = torch.randn(batch, num_q_heads, head_dim, device=device, dtype=torch.float16)
        reports: list[tuple] = []

        def ours(on_kernel=None, q=q, store=store, meta=meta, kv_format=kv_format) -> torch.Tensor:
            return paged_attention(
                q, store.data, meta, "triton", kv_format=kv_format, scales=store.scales,
                on_kernel=on_kernel,
            )  # fmt: skip

        want = paged_attention(
            q, store.data, meta, "torch", kv_format=kv_format, scales=store.scales
        )
        # One reported call for the bytes moved; the timed calls run without the callback.
        got = ours(lambda *event, sink=reports: sink.append(event))
        error = rel_error(got, want)
        ms = timed_ms(ours, device, reps)
        label = f"B={batch} ctx={context} H={num_q_heads}/{num_kv_heads} D={head_dim} {kv_format}"
        gbs = reports[0][4] / (ms / 1e3) / 1e9
        rows.append(Row("decode paged", label, ms, gbs, copy_gbs, "GB/s", goal, error))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = parser.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        device, reps, copy_bytes = torch.device("cpu"), 2, 1 << 24
        prefill_shapes = [(2, 64, 4, 2, 64, torch.float16)]
        # The interpreter's speed means nothing: no row carries a goal.
        decode_shapes = [(2, 256, 4, 2, 64, "fp16", False), (2, 256, 4, 2, 64, "int4", False)]
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
        ]
        decode_shapes = [
            (8, 32768, 32, 8, 128, "fp16", True),
            (32, 8192, 32, 8, 128, "fp16", True),
            (64, 4096, 9, 3, 64, "fp16", False),
            (8, 32768, 32, 8, 128, "fp8_e4m3", False),
            (8, 32768, 32, 8, 128, "int8", False),
            (8, 32768, 32, 8, 128, "int4", False),
        ]
    torch.manual_seed(0)
    began = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"
    copy_gbs = copy_gb_per_s(device, copy_bytes, reps)
    rows = prefill_rows(prefill_shapes, device, reps)
    rows += decode_rows(decode_shapes, device, reps, copy_gbs)

    print(f"{name}; device-to-device copy {copy_gbs:.0f} GB/s (read + write)")
    print(
        f"{'kernel':<27} {'shape':<38} {'ms':>8} {'achieved':>16} {'baseline':>16} "
        f"{'ratio':>6} {'err':>8}  verdict"
    )
    failed = False
    for r in rows:
        ok_check = r.error < 2e-2
        ok_goal = not r.goal or r.ratio >= GOAL
        failed |= not (ok_check and ok_goal)
        if not ok_check:
            verdict = "CHECK FAILED"
        elif r.goal:
            verdict = "goal met" if ok_goal else "GOAL MISSED"
        else:
            verdict = "info"
        print(
            f"{r.kind:<27} {r.shape:<38} {r.ms:>8.3f} {r.achieved:>8.1f} {r.unit:<7} "
            f"{r.baseline:>8.1f} {r.unit:<7} {r.ratio:>6.2f} {r.error:>8.1e}  {verdict}"
        )
    spent = time.perf_counter() - began
    print(
        f"baselines: prefill = torch SDPA, decode = copy bandwidth; goal {GOAL:.0%}; {spent:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
