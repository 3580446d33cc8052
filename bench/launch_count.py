"""Kernel launches per layer of one decode step on the CUDA path, counted on the CPU.

A GPU step launches one kernel per torch op that computes (views and
allocations launch nothing) plus one per Triton kernel; inside a CUDA graph
each still costs about 2 us. This script runs one batch-1 decode step of the
model as the CUDA engine would (Triton attention and, where the code has them,
the fused Triton kernels; weights bf16), on the CPU with Triton's interpreter,
and counts those launches with a ``TorchDispatchMode`` plus a hook on the
interpreter's kernel calls. It runs 1 and 2 layers and reports the difference
as the per-layer count (the embedding, final norm and LM head are the per-step
rest). ``--baseline REV`` counts the code of another commit the same way (in a
git worktree), for the before/after table:

    .venv/bin/python bench/launch_count.py --model preset:llama3-8b --baseline 6191dc4
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parents[1]

from kvscope.profiler.launch_count import measure  # noqa: E402


def baseline(rev: str, argv: list[str]) -> dict:
    """The same measurement on the code of commit ``rev``, in a temporary git worktree."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)  # fmt: skip
        try:
            script = tree / "bench" / "launch_count.py"
            script.write_text(Path(__file__).read_text())  # this counter, that code
            # The code of that commit, for this subprocess only.
            env = common.code_env(tree, {**os.environ, "TRITON_INTERPRET": "1"})
            proc = subprocess.run(
                [sys.executable, str(script), *argv, "--json"], capture_output=True, text=True, env=env, cwd=tree
            )  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(
                    f"kvscope: error: baseline run failed: {proc.stderr.strip()[-500:]}"
                )
            return json.loads(proc.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="preset:llama3-8b")
    ap.add_argument("--weights-dtype", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--kv-dtype", default="bf16")
    ap.add_argument("--path", default="cuda", choices=["cuda", "cpu"], help="cpu: the torch path")
    ap.add_argument("--baseline", metavar="REV", help="also count commit REV's code")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    argv = [
        "--model",
        args.model,
        "--weights-dtype",
        args.weights_dtype,
        "--kv-dtype",
        args.kv_dtype,
        "--path",
        args.path,
    ]
    rows = []
    if args.baseline:
        rows.append((f"before ({args.baseline})", baseline(args.baseline, argv)))
    now = measure(args.model, args.weights_dtype, args.kv_dtype, args.path)
    if args.json:
        print(json.dumps(now))
        return
    rows.append(("now", now))
    print(
        f"one batch-1 decode step, {now['model']} shape, dummy {args.weights_dtype} weights, {args.kv_dtype} KV, {args.path} path (Triton interpreter)"
    )
    for label, r in rows:
        print(
            f"{label}: {r['per_layer']} launches per layer, {r['per_step_rest']} per step besides"
        )
        print("   " + ", ".join(f"{k} {v}" for k, v in r["layer_ops"].items()))


if __name__ == "__main__":
    main()
