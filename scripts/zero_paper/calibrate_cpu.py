#!/usr/bin/env python
"""The performance model's example calibration: real runs on this machine's CPU, then the fit.

    python scripts/zero_paper/calibrate_cpu.py --output-dir docs/zero-paper/cpu-calibration [--measure]
    python -m zero.perf_model --hardware cpu-2core --calibrate docs/zero-paper/cpu-calibration/*/metrics.jsonl \\
        --output configs/hardware/calibrations/cpu-2core.yaml

Small GPTs (gloo, fp32) at three widths on one process, and at DP=2 and TP=2, so the fit tells GEMMs, memory-bound
kernels and traffic apart; `--measure` first prints the rates configs/hardware/cpu-2core.yaml records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
sys.path.insert(0, str(REPO_ROOT))

from arguments.config import ConfigError  # noqa: E402
from base.errors import OneLineArgumentParser, run_tool  # noqa: E402

VOCAB = 512
COMMON = ["--num-layers", "2", "--seq-length", "128", "--max-position-embeddings", "128", "--train-iters", "12",
          "--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
          "--tokenizer-vocab-size", str(VOCAB), "--device", "cpu", "--lr-warmup-iters", "0"]
# name: (processes, flags)
RUNS = {
    "h128-mb8": (1, ["--hidden-size", "128", "--num-attention-heads", "4", "--micro-batch-size", "8",
                     "--global-batch-size", "8"]),
    "h256-mb8": (1, ["--hidden-size", "256", "--num-attention-heads", "4", "--micro-batch-size", "8",
                     "--global-batch-size", "8"]),
    "h512-mb4": (1, ["--hidden-size", "512", "--num-attention-heads", "8", "--micro-batch-size", "4",
                     "--global-batch-size", "4"]),
    "h256-dp2-stage1": (2, ["--hidden-size", "256", "--num-attention-heads", "4", "--micro-batch-size", "8",
                            "--global-batch-size", "16", "--zero-stage", "1"]),
    "h256-dp2-stage2": (2, ["--hidden-size", "256", "--num-attention-heads", "4", "--micro-batch-size", "8",
                            "--global-batch-size", "16", "--zero-stage", "2"]),
    "h256-tp2": (2, ["--hidden-size", "256", "--num-attention-heads", "4", "--micro-batch-size", "8",
                     "--global-batch-size", "8", "--tensor-model-parallel-size", "2"]),
}


def run_one(name: str, processes: int, flags: Sequence[str], output_dir: Path, cache_dir: str) -> None:
    directory = output_dir / name
    directory.mkdir(parents=True)
    argv = [*COMMON, *flags, "--data-cache-dir", cache_dir, "--metrics-file", str(directory / "metrics.jsonl")]
    launch = {"argv": argv, "world_size": processes, "gpus_per_node": 2, "vocab_size": VOCAB}
    (directory / "launch.json").write_text(json.dumps(launch, indent=1) + "\n", encoding="utf-8")
    command = [sys.executable, str(REPO_ROOT / "scripts" / "launch.py"), "--standalone", "--nproc_per_node",
               str(processes), str(REPO_ROOT / "pretrain_gpt.py"), *argv]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    if result.returncode != 0:
        raise ConfigError(f"run {name} failed ({result.returncode}): {result.stderr.strip().splitlines()[-1:]}")
    print(f"{name}: {processes} process(es), {time.perf_counter() - started:.0f} s", flush=True)


def measure() -> None:
    """This machine's numbers for configs/hardware/cpu-2core.yaml (best of five each)."""
    import torch

    torch.set_num_threads(1)
    source = torch.ones(2**26)
    target = torch.empty_like(source)
    copy = min(_seconds(lambda: target.copy_(source)) for _ in range(5))
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    gemm = min(_seconds(lambda: torch.mm(a, b)) for _ in range(5))
    print(f"copy: {2 * source.numel() * 4 / copy / 1e9:.2f} GB/s read + write, one thread")
    print(f"fp32 GEMM 1024^3: {2 * 1024**3 / gemm / 1e9:.1f} GFLOP/s, one thread")
    script = Path(tempfile.mkdtemp()) / "gloo_all_reduce.py"
    script.write_text(GLOO_PROBE, encoding="utf-8")
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "launch.py"), "--standalone", "--nproc_per_node",
                    "2", str(script)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


GLOO_PROBE = '''
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
big, small = torch.ones(2**24), torch.ones(1)
dist.all_reduce(big)
best = 1e9
for _ in range(5):
    dist.barrier(); started = time.perf_counter(); dist.all_reduce(big); best = min(best, time.perf_counter() - started)
dist.barrier(); started = time.perf_counter()
for _ in range(100):
    dist.all_reduce(small)
latency = (time.perf_counter() - started) / 100
if dist.get_rank() == 0:
    print(f"gloo all-reduce, 2 processes: {big.numel() * 4 / best / 1e9:.2f} GB/s sent per rank, "
          f"{latency * 1e6:.0f} us per small call")
dist.destroy_process_group()
'''


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="scripts/zero_paper/calibrate_cpu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--runs", nargs="+", choices=tuple(RUNS), default=list(RUNS))
    parser.add_argument("--data-cache-dir", default=None, help="where the embedded corpus is prepared")
    parser.add_argument("--measure", action="store_true", help="first print this machine's hardware numbers")
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir)
    taken = [name for name in args.runs if (output_dir / name).exists()]
    if taken:
        raise ConfigError(f"{output_dir}: {', '.join(taken)} exist already; choose another --output-dir")
    if args.measure:
        measure()
    from data.corpus import prepare_default_corpus

    cache_dir = args.data_cache_dir or str(Path.home() / ".cache" / "zero-gpt")
    prepare_default_corpus(cache_dir, VOCAB)  # once, before the ranks start
    for name in args.runs:
        processes, flags = RUNS[name]
        run_one(name, processes, flags, output_dir, cache_dir)
    return 0


if __name__ == "__main__":
    sys.exit(run_tool("scripts/zero_paper/calibrate_cpu.py", main, (ConfigError,)))
