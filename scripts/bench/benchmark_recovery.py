#!/usr/bin/env python
"""Recovery time of a SIGKILLed rank: torchrun's restart against the in-process restart.

    python scripts/bench/benchmark_recovery.py --rounds 3 --json recovery.json

A 2-rank run of the tiny GPT loses rank 1 at iteration 5; each side prints its recovery line
(resilience/restart_progress.py), in interleaved rounds, a third side restarting after an exception."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TWELVE = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
          "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "2",
          "--train-iters", "12", "--eval-iters", "0", "--log-interval", "1", "--tokenizer-vocab-size", "512",
          "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0", "--save-interval", "2"]
INPROCESS = ["--inprocess-restart", "--inprocess-heartbeat-interval", "0.25", "--inprocess-heartbeat-timeout", "2",
             "--inprocess-granularity", "rank"]
WORKLOAD_EXCEPTION = ["--fault-injector-ranks", "1", "--fault-injector-fault-types", "workload_exc",
                      "--fault-injector-fault-delay", "0", "--fault-injector-delay-start-iteration", "3",
                      "--fault-injector-seed", "1"]
RECOVERED = re.compile(r"^> recovered \((.*?)\): .*; ([\d.]+) s from iteration \d+'s end to the first iteration "
                       r"after the restart, ([\d.]+) s to iteration", re.M)
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment() -> dict[str, str]:
    return {**{key: value for key, value in os.environ.items() if key not in LAUNCH_VARIABLES},
            "WANDB_MODE": "disabled"}


def run_flags(work: Path, cache: str) -> list[str]:
    return [*TWELVE, "--data-cache-dir", cache, "--save", str(work / "ck"), "--load", str(work / "ck"),
            "--metrics-file", str(work / "metrics.jsonl")]


def iteration_logged(metrics: Path, iteration: int) -> bool:
    if not metrics.exists():
        return False
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return any(record.get("iteration") == iteration and "loss" in record for record in records)


def kill_at(metrics: Path, victim, alive, iteration: int = 5, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not iteration_logged(metrics, iteration):
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"iteration {iteration} never came")
        time.sleep(0.02)
    os.kill(victim(), signal.SIGKILL)


def torchrun_children(launcher: subprocess.Popen, rank: int) -> int:
    for listing in Path(f"/proc/{launcher.pid}/task").glob("*/children"):
        for pid in listing.read_text().split():
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
    raise RuntimeError(f"no child runs rank {rank}")


def launched(work: Path, cache: str, launch_flags: list[str], train_flags: list[str], kill: bool) -> str:
    """scripts/launch.py, 2 ranks; rank 1 SIGKILLed after iteration 5 when `kill`."""
    command = [sys.executable, str(ROOT / "scripts" / "launch.py"), *launch_flags, "--nnodes", "1",
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               str(ROOT / "pretrain_gpt.py"), *run_flags(work, cache), *train_flags]
    with open(work / "out", "w") as out, open(work / "err", "w") as err:
        launcher = subprocess.Popen(command, cwd=work, env=environment(), stdout=out, stderr=err)
        try:
            if kill:
                kill_at(work / "metrics.jsonl", lambda: torchrun_children(launcher, 1),
                        lambda: launcher.poll() is None)
            code = launcher.wait(timeout=600)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    if code != 0:
        raise RuntimeError(f"{' '.join(train_flags)} round exited {code}: {(work / 'err').read_text()[-2000:]}")
    return (work / "out").read_text()


def torchrun_round(work: Path, cache: str) -> str:
    return launched(work, cache, ["--max-restarts", "2"], ["--enable-ft-package"], kill=True)


def inprocess_exception_round(work: Path, cache: str) -> str:
    return launched(work, cache, [], [*INPROCESS, *WORKLOAD_EXCEPTION], kill=False)


def inprocess_round(work: Path, cache: str) -> str:
    base = {**environment(), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    command = [sys.executable, str(ROOT / "pretrain_gpt.py"), *run_flags(work, cache), *INPROCESS,
               "--inprocess-active-world-size", "2"]
    processes = []
    try:
        for rank in range(3):
            with open(work / f"out{rank}", "w") as out, open(work / f"err{rank}", "w") as err:
                processes.append(subprocess.Popen(command, cwd=work, env={**base, "RANK": str(rank),
                                                                          "LOCAL_RANK": str(rank)},
                                                  stdout=out, stderr=err))
        kill_at(work / "metrics.jsonl", lambda: processes[1].pid, lambda: processes[1].poll() is None)
        codes = [process.wait(timeout=600) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    if codes != [0, -signal.SIGKILL, 0]:
        raise RuntimeError(f"in-process round exited {codes}: {(work / 'err0').read_text()[-2000:]}")
    return (work / "out0").read_text()


def recovery(out: str) -> dict:
    found = RECOVERED.findall(out)
    if len(found) != 1:
        raise RuntimeError(f"expected one recovery line, found {len(found)}")
    name, first, again = found[0]
    return {"restart": name, "to_first_iteration_s": float(first), "to_lost_iteration_s": float(again)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from data.corpus import prepare_default_corpus

    modes = {"torchrun": torchrun_round, "in-process": inprocess_round,
             "in-process, exception": inprocess_exception_round}
    rounds = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="recovery-") as scratch:
        cache = str(Path(scratch) / "cache")
        prepare_default_corpus(cache, 512)
        for index in range(args.rounds):
            order = list(modes)[index % len(modes):] + list(modes)[:index % len(modes)]  # each goes first once
            for mode in order:
                work = Path(scratch) / f"{mode.replace(', ', '-')}-{index}"
                work.mkdir()
                load = os.getloadavg()[0]
                figures = {**recovery(modes[mode](work, cache)), "load_average_1min": load}
                rounds[mode].append(figures)
                print(f"round {index + 1} {mode}: {figures['to_first_iteration_s']:.1f} s to the first iteration "
                      f"after the restart, {figures['to_lost_iteration_s']:.1f} s back to the lost one "
                      f"(load average {load:.1f})", flush=True)
    summary = {mode: {"median_to_first_iteration_s": statistics.median(r["to_first_iteration_s"] for r in runs),
                      "median_to_lost_iteration_s": statistics.median(r["to_lost_iteration_s"] for r in runs)}
               for mode, runs in rounds.items()}
    for mode, medians in summary.items():
        print(f"{mode}: median {medians['median_to_first_iteration_s']:.1f} s to the first iteration after the "
              f"restart, {medians['median_to_lost_iteration_s']:.1f} s back to the lost one "
              f"({args.rounds} rounds; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "medians": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
