"""Host time per decode step: everything an engine step does but the model's forward.

Building the batch and its metadata, staging the inputs, sampling's host
side and the bookkeeping after it, at batch 1 / 32 / 128, for this checkout
and for a baseline commit (default: the code before issue 22's host-side
work), measured in the same run: each (code, batch) runs in its own
subprocess, the two codes alternate, and the best of ``--rounds`` medians
is kept. The baseline is checked out into a temporary ``git worktree``
(the checkout's HEAD is never touched) and removed afterwards.

The model is tests/tiny_model.py's 2-layer Llama, so the forward is short;
its wall time (attention and KV writes included) is measured around
``DecoderModel.forward`` and subtracted from each step's. On the CPU the
device is the host: the host-to-device copies a GPU needs cost nothing here,
and a GPU's figures are not measured by this script.

Run: ``python bench/host_time.py [--batches 1 32 128] [--baseline COMMIT] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "6191dc4"  # main before issue 22's host-side changes
GOALS_US = {1: 50, 32: 200, 128: 600}


def worker(root: Path, batch: int, steps: int) -> dict:
    """Median host microseconds of ``steps`` decode steps at ``batch`` for the code in ``root``."""
    sys.path.insert(0, str(root))
    import torch

    torch.set_num_threads(1)
    from engine.engine import Engine
    from engine.engine_config import EngineConfig
    from engine.sampler import SamplingParams
    from tests.tiny_model import tiny_loaded

    prompt = 256
    tokens = batch * (prompt + steps + 8)
    per_token = 2 * 2 * 2 * 8 * 4  # 2 layers x K,V x 2 KV heads x head_dim 8 x fp32
    config = EngineConfig(
        kv_budget_bytes=(tokens + 64 * 16) * per_token,
        max_num_seqs=batch,
        max_batched_tokens=max(2048, batch),
        prefix_cache=False,
    )
    engine = Engine(config, loaded=tiny_loaded(max_position=1024))
    g = torch.Generator().manual_seed(batch)
    for _ in range(batch):
        ids = torch.randint(1, 64, (prompt,), generator=g).tolist()
        engine.add_request(ids, SamplingParams(max_tokens=steps + 4, ignore_eos=True))
    forward_s = [0.0]
    model_forward = engine.model.forward

    def timed_forward(*args, **kwargs):
        t0 = time.perf_counter()
        out = model_forward(*args, **kwargs)
        forward_s[0] += time.perf_counter() - t0
        return out

    engine.model.forward = timed_forward
    while any(r.in_prefill for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    host = []
    for _ in range(steps):
        forward_s[0] = 0.0
        t0 = time.perf_counter()
        engine.step()
        host.append(time.perf_counter() - t0 - forward_s[0])
    return {"host_us": statistics.median(host) * 1e6, "steps": steps}


def run_worker(root: Path, batch: int, steps: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(root)]
    cmd += ["--batches", str(batch), "--steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, check=False)
    if out.returncode != 0:
        raise SystemExit(f"host_time: error: worker failed in {root}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["host_us"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--baseline", default=BASELINE, help="commit to compare against")
    ap.add_argument("--steps", type=int, default=30, help="decode steps timed per run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per code and batch")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.batches[0], args.steps)))
        return 0
    # Imported here, not at the top: a worker runs with the baseline's tree on its
    # path, and that code may predate app/progress.py.
    from app.progress import Progress

    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "baseline"
        add = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.baseline]
        if subprocess.run(add, capture_output=True, check=False).returncode != 0:
            print(f"host_time: error: cannot check out {args.baseline!r}", file=sys.stderr)
            return 2
        try:
            rows = []
            progress = Progress(len(args.batches) * args.rounds * 2, "worker runs")
            for batch in args.batches:
                best = {"baseline": float("inf"), "now": float("inf")}
                for _ in range(args.rounds):
                    for name, root in (("baseline", old), ("now", ROOT)):
                        best[name] = min(best[name], run_worker(root, batch, args.steps))
                        progress.advance()
                rows.append({"batch": batch, **best, "goal_us": GOALS_US.get(batch)})
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                capture_output=True,
                check=False,
            )
    if args.json:
        print(json.dumps({"baseline": args.baseline, "rows": rows}))
        return 0
    print(f"host time per decode step (us), baseline {args.baseline} vs this checkout")
    print(f"| {'batch':>5} | {'baseline':>9} | {'now':>9} | {'speed-up':>8} | {'goal':>6} | met |")
    for r in rows:
        goal = r["goal_us"]
        met = "-" if goal is None else ("yes" if r["now"] <= goal else "no")
        print(
            f"| {r['batch']:>5} | {r['baseline']:>9.1f} | {r['now']:>9.1f} | "
            f"{r['baseline'] / r['now']:>7.2f}x | {goal or '-':>6} | {met:>3} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
