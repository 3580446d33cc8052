"""Host time per decode step: everything an engine step does but the model's forward.

Building the batch and its metadata, staging the inputs, sampling's host
side and the bookkeeping after it, at batch 1 / 32 / 128, for this checkout
and for a baseline commit (default: the code before issue 22's host-side
work), measured in the same run: each (code, batch) runs in its own
subprocess, the two codes alternate, and the best of ``--rounds`` medians
is kept. The baseline is checked out into a temporary ``git worktree``
(the checkout's HEAD is never touched) and removed afterwards.

The model is kvscope.engine.tiny's 2-layer Llama, so the forward is short;
its wall time (attention and KV writes included) is measured around
``DecoderModel.forward`` and subtracted from each step's. On the CPU the
device is the host: the host-to-device copies a GPU needs cost nothing here,
and a GPU's figures are not measured by this script.

A second table shows what async scheduling (``--async-scheduling on``) hides:
the interval between two decode launches, serial vs async, with a SIMULATED
device: each forward's own CPU time is taken off the clock and stands in as a
fixed ``--device-ms`` of device time that runs while the host goes on, and
reading a step's tokens spins until that step's simulated device time is over.
Serial, a step costs device + host; async, about max(device, host). Nothing in
it is a GPU measurement.

``--queue`` measures a serving workload instead, with the same simulated device:
64 requests arriving over the run (a queue longer than ``max_num_seqs`` 16, prompts
that the 256-token budget chunks, half of them sharing a prefix), serial and async,
for the baseline commit and this checkout: the share of decode steps launched ahead
of the step in flight, and the run's simulated time.

Run: ``python bench/host_time.py [--batches 1 32 128] [--baseline COMMIT] [--device-ms 2]
[--queue] [--json]``
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

import common

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "6191dc4"  # main before issue 22's host-side changes
GOALS_US = {1: 50, 32: 200, 128: 600}


def _decoding_engine(root: Path, batch: int, steps: int, **config):
    """An engine on the tiny model with ``batch`` requests past their prefill, decoding."""
    import torch

    torch.set_num_threads(1)
    from kvscope.engine.engine import Engine
    from kvscope.engine.engine_config import EngineConfig
    from kvscope.engine.sampler import SamplingParams
    from kvscope.engine.tiny import tiny_loaded

    prompt = 256
    tokens = batch * (prompt + steps + 8)
    per_token = 2 * 2 * 2 * 8 * 4  # 2 layers x K,V x 2 KV heads x head_dim 8 x fp32
    config = EngineConfig(
        kv_budget_bytes=(tokens + 64 * 16) * per_token,
        max_num_seqs=batch,
        max_batched_tokens=max(2048, batch),
        prefix_cache=False,
        **config,
    )
    engine = Engine(config, loaded=tiny_loaded(max_position=1024))
    g = torch.Generator().manual_seed(batch)
    for _ in range(batch):
        ids = torch.randint(1, 64, (prompt,), generator=g).tolist()
        engine.add_request(ids, SamplingParams(max_tokens=steps + 4, ignore_eos=True))
    while any(r.in_prefill for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    return engine


def worker(root: Path, batch: int, steps: int) -> dict:
    """Median host microseconds of ``steps`` decode steps at ``batch`` for the code in ``root``."""
    engine = _decoding_engine(root, batch, steps)
    forward_s = [0.0]
    model_forward = engine.model.forward

    def timed_forward(*args, **kwargs):
        t0 = time.perf_counter()
        out = model_forward(*args, **kwargs)
        forward_s[0] += time.perf_counter() - t0
        return out

    engine.model.forward = timed_forward
    host = []
    for _ in range(steps):
        forward_s[0] = 0.0
        t0 = time.perf_counter()
        engine.step()
        host.append(time.perf_counter() - t0 - forward_s[0])
    return {"host_us": statistics.median(host) * 1e6, "steps": steps}


def async_worker(batch: int, steps: int, mode: str, device_ms: float) -> dict:
    """Median microseconds between two decode launches, with a simulated device.

    A virtual clock runs without the forwards' own CPU time; each forward then
    occupies the simulated device for ``device_ms`` from its launch (or from when
    the device frees up), and reading a step's tokens spins until its device time
    is over. The launches' virtual times give the interval per step.
    """
    engine = _decoding_engine(ROOT, batch, steps, async_scheduling=mode)
    _, launches, _ = _simulated_device(engine, device_ms)
    for _ in range(steps):
        engine.step()
    gaps = [b - a for a, b in zip(launches, launches[1:], strict=False)]
    return {"step_us": statistics.median(gaps) * 1e6, "steps_ahead": engine.steps_ahead}


QUEUE = {"requests": 64, "max_num_seqs": 16, "max_batched_tokens": 256, "per_step": 2}


def _simulated_device(engine, device_ms: float) -> tuple:
    """Patch ``engine`` onto a simulated device (see ``async_worker``); returns the
    virtual clock and the forwards' launch times."""
    import kvscope.engine.engine as engine_module

    device_s = device_ms / 1e3
    excluded = [0.0]  # the forwards' CPU time, off the virtual clock
    busy_until = [0.0]
    launches: list[float] = []
    done: dict[int, float] = {}  # id(SampledTokens) -> its step's end on the simulated device

    def vnow() -> float:
        return time.perf_counter() - excluded[0]

    model_forward = engine.model.forward

    def device_forward(*args, **kwargs):
        t0 = time.perf_counter()
        out = model_forward(*args, **kwargs)
        excluded[0] += time.perf_counter() - t0
        start = max(vnow(), busy_until[0])
        busy_until[0] = start + device_s
        launches.append(start)
        return out

    tokens_class = engine_module.SampledTokens
    init, read = tokens_class.__init__, tokens_class.tolist

    def sampled(self, *args, **kwargs):
        init(self, *args, **kwargs)
        done[id(self)] = busy_until[0]  # sampled right after the forward it belongs to

    def tolist(self):
        # Spin, as a CUDA event wait does, not sleep (whose late wake-up would count as
        # host time); tokens launched before the clock started wait for nothing.
        end = done.pop(id(self), 0.0)
        while vnow() < end:
            pass
        return read(self)

    engine.model.forward = device_forward
    tokens_class.__init__, tokens_class.tolist = sampled, tolist
    return vnow, launches, busy_until


def queue_worker(root: Path, mode: str, device_ms: float) -> dict:
    """The ``--queue`` workload on the code in ``root``: decode steps, how many ran ahead,
    the simulated run time (until the last step's device time is over)."""
    import torch

    torch.set_num_threads(1)
    from kvscope.engine.engine import Engine
    from kvscope.engine.engine_config import EngineConfig
    from kvscope.engine.sampler import SamplingParams
    from kvscope.engine.tiny import tiny_loaded

    q = QUEUE
    per_token = 2 * 2 * 2 * 8 * 4  # 2 layers x K,V x 2 KV heads x head_dim 8 x fp32
    config = EngineConfig(
        kv_budget_bytes=4096 * 16 * per_token,
        max_num_seqs=q["max_num_seqs"],
        max_batched_tokens=q["max_batched_tokens"],
        async_scheduling=mode,
    )
    engine = Engine(config, loaded=tiny_loaded(max_position=1024))
    g = torch.Generator().manual_seed(7)
    shared = torch.randint(1, 64, (96,), generator=g).tolist()
    work = []
    for i in range(q["requests"]):
        n = int(torch.randint(16, 320, (1,), generator=g))
        own = torch.randint(1, 64, (n,), generator=g).tolist()
        out = int(torch.randint(8, 64, (1,), generator=g))
        work.append(((shared if i % 2 else []) + own, out))
    decode_steps = [0]
    advance = engine._advance

    def counted(batch):
        prefill = advance(batch)
        decode_steps[0] += batch.num_tokens > prefill
        return prefill

    engine._advance = counted
    vnow, _, busy_until = _simulated_device(engine, device_ms)
    t0 = vnow()
    while work or engine.has_unfinished():
        for prompt, out in work[: q["per_step"]]:
            engine.add_request(prompt, SamplingParams(max_tokens=out, ignore_eos=True))
        del work[: q["per_step"]]
        engine.step()
    ahead = getattr(engine, "decode_steps_ahead", engine.steps_ahead)
    return {
        "decode_steps": decode_steps[0],
        "ahead": ahead,
        "steps": engine.step_count,
        "run_ms": (max(vnow(), busy_until[0]) - t0) * 1e3,
    }


def queue_rows(old: Path, rounds: int, device_ms: float, progress) -> list:
    """Per (code, mode): the queue workload's figures, the best run time of ``rounds``."""
    rows = []
    for name, root in (("baseline", old), ("now", ROOT)):
        for mode in ("off", "on"):
            best: dict | None = None
            for _ in range(rounds):
                got = run_worker(root, 0, 0, "--queue-mode", mode, "--device-ms", str(device_ms))
                if best is None or got["run_ms"] < best["run_ms"]:
                    best = got
                progress.advance()
            rows.append({"code": name, "mode": mode, **best})
    return rows


def run_worker(root: Path, batch: int, steps: int, *extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if root != ROOT:  # a baseline commit's tree, for this subprocess only
        env = common.code_env(root, env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(root)]
    cmd += ["--batches", str(batch), "--steps", str(steps), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, check=False)
    if out.returncode != 0:
        raise SystemExit(f"host_time: error: worker failed in {root}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def async_rows(batches: list[int], steps: int, rounds: int, device_ms: float, progress) -> list:
    """Per batch: the best of ``rounds`` median launch intervals, serial and async."""
    rows = []
    for batch in batches:
        best = {"off": float("inf"), "on": float("inf")}
        ahead = 0
        for _ in range(rounds):
            for mode in ("off", "on"):
                extra = ("--async-mode", mode, "--device-ms", str(device_ms))
                got = run_worker(ROOT, batch, steps, *extra)
                best[mode] = min(best[mode], got["step_us"])
                ahead = max(ahead, got["steps_ahead"]) if mode == "on" else ahead
                progress.advance()
        rows.append(
            {
                "batch": batch,
                "serial_us": best["off"],
                "async_us": best["on"],
                "hidden_us": best["off"] - best["on"],
                "steps_ahead": ahead,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--baseline", default=BASELINE, help="commit to compare against")
    ap.add_argument("--steps", type=int, default=30, help="decode steps timed per run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per code and batch")
    ap.add_argument(
        "--device-ms",
        type=float,
        default=2.0,
        help="simulated device time per forward for the async table (0: no async table)",
    )
    ap.add_argument(
        "--queue",
        action="store_true",
        help="only the serving workload with arrivals and a queue (serial vs async, baseline vs now)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--async-mode", choices=("on", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--queue-mode", choices=("on", "off"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device_ms < 0:
        print("host_time: error: --device-ms must be >= 0", file=sys.stderr)
        return 2
    if args.queue and args.device_ms <= 0:
        print("host_time: error: --queue needs --device-ms > 0", file=sys.stderr)
        return 2
    if args.worker is not None:
        if args.queue_mode is not None:
            got = queue_worker(args.worker, args.queue_mode, args.device_ms)
        elif args.async_mode is not None:
            got = async_worker(args.batches[0], args.steps, args.async_mode, args.device_ms)
        else:
            got = worker(args.worker, args.batches[0], args.steps)
        print(json.dumps(got))
        return 0
    # Imported here, not at the top: a worker runs with the baseline's tree on its
    # path, and that code may predate app/progress.py.
    from kvscope.app.progress import Progress

    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "baseline"
        add = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.baseline]
        if subprocess.run(add, capture_output=True, check=False).returncode != 0:
            print(f"host_time: error: cannot check out {args.baseline!r}", file=sys.stderr)
            return 2
        if args.queue:
            try:
                progress = Progress(2 * 2 * args.rounds, "worker runs")
                queue = queue_rows(old, args.rounds, args.device_ms, progress)
            finally:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                    capture_output=True,
                    check=False,
                )
            return _print_queue(args, queue)
        try:
            rows = []
            tables = 2 if args.device_ms > 0 else 1
            progress = Progress(len(args.batches) * args.rounds * 2 * tables, "worker runs")
            for batch in args.batches:
                best = {"baseline": float("inf"), "now": float("inf")}
                for _ in range(args.rounds):
                    for name, root in (("baseline", old), ("now", ROOT)):
                        got = run_worker(root, batch, args.steps)["host_us"]
                        best[name] = min(best[name], got)
                        progress.advance()
                rows.append({"batch": batch, **best, "goal_us": GOALS_US.get(batch)})
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                capture_output=True,
                check=False,
            )
    overlap = (
        async_rows(args.batches, args.steps, args.rounds, args.device_ms, progress)
        if args.device_ms > 0
        else []
    )
    if args.json:
        print(
            json.dumps(
                {
                    "baseline": args.baseline,
                    "rows": rows,
                    "async": {"device_ms": args.device_ms, "simulated": True, "rows": overlap},
                }
            )
        )
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
    if overlap:
        print(
            f"\nasync scheduling: us between two decode launches, SIMULATED device of "
            f"{args.device_ms:g} ms per forward (a wait, not a GPU; the CPU forward's time is "
            "off the clock)"
        )
        print(f"| {'batch':>5} | {'serial':>9} | {'async':>9} | {'hidden':>9} | steps ahead |")
        for r in overlap:
            print(
                f"| {r['batch']:>5} | {r['serial_us']:>9.1f} | {r['async_us']:>9.1f} | "
                f"{r['hidden_us']:>9.1f} | {r['steps_ahead']:>11} |"
            )
    return 0


def _print_queue(args: argparse.Namespace, rows: list[dict]) -> int:
    for r in rows:
        r["share_ahead"] = r["ahead"] / r["decode_steps"] if r["decode_steps"] else 0.0
    if args.json:
        info = {"device_ms": args.device_ms, "simulated": True, "workload": QUEUE}
        print(json.dumps({"baseline": args.baseline, "queue": {**info, "rows": rows}}))
        return 0
    q = QUEUE
    print(
        f"queue: {q['requests']} requests arriving {q['per_step']} a step, max_num_seqs "
        f"{q['max_num_seqs']}, budget {q['max_batched_tokens']}; SIMULATED device of "
        f"{args.device_ms:g} ms per forward (best run time of {args.rounds})"
    )
    print(
        f"| {'code':>8} | {'async':>5} | {'steps':>5} | {'decode steps':>12} | "
        f"{'ahead':>5} | {'share':>6} | {'run ms':>8} |"
    )
    for r in rows:
        print(
            f"| {r['code']:>8} | {r['mode']:>5} | {r['steps']:>5} | {r['decode_steps']:>12} | "
            f"{r['ahead']:>5} | {r['share_ahead']:>6.1%} | {r['run_ms']:>8.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
