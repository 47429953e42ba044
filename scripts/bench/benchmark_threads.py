#!/usr/bin/env python
"""Time per iteration of `pretrain_gpt.py` with one torch thread against more, in the same moments.

    python scripts/bench/benchmark_threads.py --threads 1 2 --rounds 3 -- --num-layers 2   # after --: each run's flags

Each round runs once per thread count, the order alternating; a run's figure is its median iter_time_s after the
first, beside the load average. The losses must not change with the thread count."""

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

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

from benchmark_model import cpu_name  # noqa: E402  (the one reader of the CPU's name)


def one_run(threads: int, train_iters: int, extra: list[str], workdir: Path) -> dict:
    metrics = workdir / f"metrics-{threads}-{time.monotonic_ns()}.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "WANDB_MODE": "disabled"}
    argv = [sys.executable, str(ROOT / "pretrain_gpt.py"), "--train-iters", str(train_iters), "--log-interval", "1",
            "--eval-iters", "0", "--metrics-file", str(metrics), *extra]
    load_before = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"benchmark_threads.py: the run with {threads} threads exited {done.returncode}: "
                         f"{done.stderr.strip().splitlines()[-1:] or done.stdout[-500:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    records = [r for r in records if "iter_time_s" in r]
    times = [r["iter_time_s"] for r in records]
    return {"threads": threads, "iteration_ms": [t * 1e3 for t in times],
            "median_ms_after_first": statistics.median(times[1:]) * 1e3 if len(times) > 1 else times[0] * 1e3,
            "losses": [r["loss"] for r in records], "run_wall_s": wall,
            "load_average_before": list(load_before), "load_average_after": list(os.getloadavg())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1],
                   help="thread counts to compare (default: 1 and every core)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--train-iters", type=int, default=12)
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--label", default="default preset (configs/models/tiny.yaml)", help="what is trained, in words")
    p.add_argument("extra", nargs="*", help="flags for pretrain_gpt.py (after --)")
    args = p.parse_args(argv)
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__}
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for round_index in range(args.rounds):
            order = args.threads if round_index % 2 == 0 else list(reversed(args.threads))
            for threads in order:
                row = one_run(threads, args.train_iters, args.extra, Path(workdir))
                row["round"] = round_index
                rows.append(row)
                print(f"round {round_index}: {threads} thread(s): median {row['median_ms_after_first']:.0f} ms per "
                      f"iteration; load average {row['load_average_before'][0]:.2f} before, "
                      f"{row['load_average_after'][0]:.2f} after", flush=True)
    summary = {t: statistics.median(r["median_ms_after_first"] for r in rows if r["threads"] == t)
               for t in args.threads}
    same_losses = len({tuple(round(x, 5) for x in r["losses"]) for r in rows}) == 1
    for t, ms in summary.items():
        print(f"{t} thread(s): {ms:.0f} ms per iteration (median over rounds)")
    print(f"losses equal across thread counts (5 decimals): {same_losses}")
    if args.json:
        Path(args.json).write_text(json.dumps({"what": args.label, "machine": machine, "pretrain_gpt_flags": args.extra,
                                               "train_iters": args.train_iters, "rows": rows,
                                               "median_ms_by_threads": summary, "losses_equal": same_losses},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
