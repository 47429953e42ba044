#!/usr/bin/env python
"""The wall time checkpoint saves add to a run, written synchronously against --async-save, in the same moments.

    python scripts/bench/benchmark_async_save.py --quick     # the tiny preset, 1 round

Each round trains the run without saves, with synchronous and with async saves, in a rotating order; what saves add
is a run's span less the round's run without them. The three runs must log the same losses."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPT2_124M = ["--config", "gpt2-124m", "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "1"]
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--tokenizer-vocab-size", "512"]
MODES = {"none": [], "sync": ["--save-interval"], "async": ["--save-interval"]}
BACKGROUND = ["--async-save", "--use-persistent-ckpt-worker"]
SYNC_SAVE = re.compile(r"saved checkpoint \S+ \(([\d.]+) MiB in ([\d.]+) s\)")
STAGED = re.compile(r"staged checkpoint at iteration (\d+): ([\d.]+) MiB copied to host memory in ([\d.]+) s; "
                    r"training blocked ([\d.]+) s")
COMMITTED = re.compile(r"saved checkpoint \S+ \(([\d.]+) MiB; written in the background in ([\d.]+) s, committed "
                       r"([^,]+),")
START = "> run "


def one_run(mode: str, base: list[str], save_interval: int, workdir: Path) -> dict:
    """pretrain_gpt.py in `mode` ("none", "sync", "async"); its span, its save lines' figures and its losses."""
    run_name = f"{mode}-{time.monotonic_ns()}"
    metrics, save = workdir / f"metrics-{run_name}.jsonl", workdir / f"save-{run_name}"
    argv = [sys.executable, str(ROOT / "pretrain_gpt.py"), *base, "--metrics-file", str(metrics)]
    if mode != "none":
        argv += ["--save", str(save), "--save-interval", str(save_interval)] + (BACKGROUND if mode == "async" else [])
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()
    lines, start = [], None
    process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if start is None and line.startswith(START):
            start = time.perf_counter()
        lines.append(line.rstrip("\n"))
    process.wait()
    end = time.perf_counter()
    if process.returncode != 0 or start is None:
        raise SystemExit(f"benchmark_async_save.py: the {mode} run exited {process.returncode}:\n"
                         + "\n".join(lines[-20:]))
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    row = {"mode": mode, "span_s": end - start, "losses": [r["loss"] for r in records if "iter_time_s" in r],
           "iteration_s": [r["iter_time_s"] for r in records if "iter_time_s" in r],
           "load_average_before": list(load_before), "load_average_after": list(os.getloadavg())}
    text = "\n".join(lines)
    if mode == "sync":
        row["saves"] = [{"mib": float(mib), "seconds": float(s)} for mib, s in SYNC_SAVE.findall(text)]
    if mode == "async":
        row["saves"] = [{"iteration": int(i), "staged_mib": float(mib), "staging_s": float(s), "blocked_s": float(b)}
                        for i, mib, s, b in STAGED.findall(text)]
        for save, (mib, written, when) in zip(row["saves"], COMMITTED.findall(text)):
            save.update(written_mib=float(mib), write_s=float(written), committed=when)
    shutil.rmtree(save, ignore_errors=True)  # a run's checkpoints take GBs of disk
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-iters", type=int, default=12)
    p.add_argument("--save-interval", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the tiny model, 1 round (a check of this script)")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("extra", nargs="*", help="flags for pretrain_gpt.py (after --)")
    args = p.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    base = [*(TINY if args.quick else GPT2_124M), "--train-iters", str(args.train_iters), "--eval-iters", "0",
            "--log-interval", "1", *args.extra]
    rows, order = [], list(MODES)
    with tempfile.TemporaryDirectory() as workdir:
        for round_index in range(rounds):
            for mode in order[round_index % 3:] + order[:round_index % 3]:
                row = one_run(mode, base, args.save_interval, Path(workdir))
                row["round"] = round_index
                rows.append(row)
                print(f"round {round_index}: {mode:>5} saves: {row['span_s']:.1f} s; load average "
                      f"{row['load_average_before'][0]:.2f} before, {row['load_average_after'][0]:.2f} after",
                      flush=True)
    for round_index in range(rounds):
        of_round = {row["mode"]: row for row in rows if row["round"] == round_index}
        if not of_round["none"]["losses"] == of_round["sync"]["losses"] == of_round["async"]["losses"]:
            raise SystemExit(f"benchmark_async_save.py: round {round_index}'s runs logged different losses")
        for mode in ("sync", "async"):
            of_round[mode]["added_s"] = of_round[mode]["span_s"] - of_round["none"]["span_s"]
    added = {mode: statistics.median(row["added_s"] for row in rows if row["mode"] == mode) for mode in ("sync", "async")}
    ratio = added["async"] / added["sync"] if added["sync"] > 0 else float("nan")
    print(f"the saves added {added['sync']:.1f} s written synchronously and {added['async']:.1f} s with --async-save "
          f"(median over {rounds} round(s)): {ratio:.2f} of it", flush=True)
    if args.json:
        summary = {"command": "python scripts/bench/benchmark_async_save.py " + " ".join(argv or sys.argv[1:]),
                   "run": base, "save_interval": args.save_interval, "cores": os.cpu_count(),
                   "added_s_median": added, "async_over_sync": ratio, "runs": rows}
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
