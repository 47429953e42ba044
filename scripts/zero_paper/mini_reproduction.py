#!/usr/bin/env python
"""The memory side of the ZeRO paper's Figures 6-7, measured for real on this machine's CPU.

    python scripts/zero_paper/mini_reproduction.py --output docs/zero-paper/mini-reproduction.json

C1-C5 at a small size (TP 2 x DP 2 gloo processes, hidden 256, sequence 256, micro batch 8, bf16, every layer
checkpointed, M_D on), two iterations at two depths with --report-memory; the planner plans the same ranks. One
launch runs them all: the script is its own worker on every rank."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
sys.path[:0] = [str(REPO_ROOT), str(HERE)]

from arguments.config import ConfigError  # noqa: E402
from arguments.deepspeed.translation import deepspeed_config_to_flags, resolve_zero_config  # noqa: E402
from base.errors import OneLineArgumentParser, run_tool  # noqa: E402
from experiments import portable_argv  # noqa: E402
from planner.plan import CONFIGURATIONS  # noqa: E402

WORLD_SIZE, TENSOR_PARALLEL = 4, 2
VOCAB = 512


def scaled_zero_config(configuration: str, bucket_size: int, directory: Path) -> Path:
    """configs/zero/zero_paper_cN.json with its buckets sized for this model, as the paper's 5e8 / 2e8
    elements are for theirs (a few buckets per model), written into `directory`. A copy, not flags
    beside the JSON: a bucket flag beside the JSON's bucket keys loses to them, as in DeepSpeed
    (arguments/deepspeed/precedence.py)."""
    zero_config = json.loads(resolve_zero_config(f"zero_paper_{configuration.lower()}").read_text(encoding="utf-8"))
    zero_config["zero_optimization"].update(reduce_bucket_size=bucket_size, allgather_bucket_size=bucket_size)
    path = directory / f"zero_paper_{configuration.lower()}_buckets_{bucket_size}.json"
    path.write_text(json.dumps(zero_config, indent=1), encoding="utf-8")
    return path


def run_argv(configuration: str, layers: int, args, metrics: Path, cache_dir: str) -> list[str]:
    """pretrain_gpt.py's flags for one configuration at one depth (configs/zero/zero_paper_cN.json,
    its buckets scaled, written beside `metrics`)."""
    zero_config = scaled_zero_config(configuration, args.bucket_size, metrics.parent)
    # A launch that sets the model from flags reads the JSON's activation_checkpointing block only as Megatron
    # does (not at all here: arguments/deepspeed/client_objects.py), so the configuration's P_a, P_a+cpu and
    # M_D, and checkpointing itself, are said as the flags the block stands for.
    block = json.loads(zero_config.read_text(encoding="utf-8"))["activation_checkpointing"]
    checkpointing = deepspeed_config_to_flags({"activation_checkpointing": block}, str(zero_config)).argv
    return ["--zero-config", str(zero_config), *checkpointing, *depth_flags(layers, args),
            "--data-cache-dir", cache_dir, "--metrics-file", str(metrics)]


def depth_flags(layers: int, args) -> list[str]:
    """The flags every configuration shares at one depth."""
    return ["--num-layers", str(layers), "--hidden-size", str(args.hidden_size), "--num-attention-heads", "4",
            "--seq-length", str(args.seq_length),
            "--max-position-embeddings", str(args.seq_length), "--micro-batch-size", str(args.micro_batch_size),
            "--global-batch-size", str(args.micro_batch_size * WORLD_SIZE // TENSOR_PARALLEL),
            "--tensor-model-parallel-size", str(TENSOR_PARALLEL), "--bf16", "--no-accumulate-allreduce-grads-in-fp32",
            "--train-iters", "2", "--log-interval", "1", "--eval-iters", "0", "--report-memory",
            "--hidden-dropout", "0", "--attention-dropout", "0", "--tokenizer-vocab-size", str(VOCAB),
            "--device", "cpu"]


def check_runs_fit(args) -> None:
    """Both depths' settings through pretrain_gpt.py's own checks and this machine's bounds
    (arguments/bounds.py) for the launch's WORLD_SIZE ranks, before the corpus, the work directory or
    a rank exists: `--layers 1000000 1000001` was OOM-killed after minutes (issue 33 #14)."""
    import math

    from arguments.bounds import check_machine_bounds
    from arguments.parser import parse_config
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    for layers in args.layers:
        flags = depth_flags(layers, args)
        try:
            check_machine_bounds(parse_config(flags), world_size=WORLD_SIZE)
        except ConfigError as error:
            raise ConfigError(f"--layers {layers} with --hidden-size {args.hidden_size}, --seq-length "
                              f"{args.seq_length}, --micro-batch-size {args.micro_batch_size}: {error}") from None


def worker(runs_file: str) -> None:
    """On every rank: one process group, the runs one after another (each a full pretrain_gpt.run)."""
    import pretrain_gpt
    from arguments.parser import parse_config
    from parallel.state import destroy, initialize

    runs = json.loads(Path(runs_file).read_text(encoding="utf-8"))
    state = initialize("cpu", TENSOR_PARALLEL)
    try:
        for run in runs:
            pretrain_gpt.run(parse_config(run["argv"]), state)
    finally:
        destroy(state)


def measured_record(metrics: Path) -> list[dict]:
    for line in metrics.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if isinstance(record.get("memory"), list):
            return sorted(record["memory"], key=lambda rank: rank["rank"])
    raise ConfigError(f"{metrics}: no --report-memory record")


def planned_ranks(argv: Sequence[str]) -> list[dict]:
    """What the planner says every rank holds (the ranks differ only by alignment padding)."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run

    config = parse_config(argv)
    cluster = Cluster(WORLD_SIZE, WORLD_SIZE, None, "cpu")
    return [_plan_summary(dry_run(config, cluster, VOCAB, rank)) for rank in range(WORLD_SIZE)]


def _plan_summary(plan) -> dict:
    return {"rank": plan.rank, "model_state_bytes": plan.model_state_bytes["total"], "buffer_bytes": plan.buffer_bytes,
            "saved_activation_device_bytes": plan.saved_activation_bytes["device"],
            "saved_activation_host_bytes": plan.saved_activation_bytes["host"], "total_bytes": plan.total_bytes}


def _measured_summary(rank: dict) -> dict:
    return {"rank": rank["rank"], "model_state_bytes": rank["measured_total_bytes"],
            "buffer_bytes": rank.get("measured_buffers_bytes", 0),
            "saved_activation_device_bytes": rank["saved_activation_device_bytes"],
            "saved_activation_host_bytes": rank["saved_activation_host_bytes"]}


def _launch(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    """Run the launch in its own process group, so a hang ends the launcher and every rank with it."""
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"},
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise ConfigError(f"the launch did not finish in {timeout:g} s (--timeout); its processes were stopped") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def reproduce(args, argv: Sequence[str]) -> dict:
    from data.corpus import prepare_default_corpus

    cache_dir = args.data_cache_dir or str(Path.home() / ".cache" / "zero-gpt")
    prepare_default_corpus(cache_dir, VOCAB)  # once, before the ranks start
    work = Path(tempfile.mkdtemp(prefix="zero-paper-mini-"))
    runs = [{"configuration": name, "layers": layers,
             "argv": run_argv(name, layers, args, work / f"{name}-{layers}.jsonl", cache_dir)}
            for layers in args.layers for name in args.configurations]
    (work / "runs.json").write_text(json.dumps(runs), encoding="utf-8")
    command = [sys.executable, str(REPO_ROOT / "scripts" / "launch.py"), "--standalone", "--nproc_per_node",
               str(WORLD_SIZE), str(Path(__file__).resolve()), "--worker", str(work / "runs.json")]
    started = time.perf_counter()
    results = []
    try:
        result = _launch(command, args.timeout)
        if result.returncode != 0:
            raise ConfigError(f"the launch failed ({result.returncode}): "
                              f"{' '.join(result.stderr.strip().splitlines()[-3:])}")
        seconds = time.perf_counter() - started
        for run in runs:
            metrics = Path(run["argv"][run["argv"].index("--metrics-file") + 1])
            results.append({"configuration": run["configuration"], "layers": run["layers"],
                            "measured": [_measured_summary(rank) for rank in measured_record(metrics)],
                            "planned": planned_ranks(run["argv"])})
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the runs' own files: what matters is now in `results`
    return {"what": "per-rank memory of C1-C5 on CPU (gloo), measured with --report-memory and planned with "
                    "planner/dry_run.py", "world_size": WORLD_SIZE, "tensor_parallel_size": TENSOR_PARALLEL,
            "data_parallel_size": WORLD_SIZE // TENSOR_PARALLEL, "hidden_size": args.hidden_size,
            "seq_length": args.seq_length, "micro_batch_size": args.micro_batch_size, "precision": "bf16",
            "configurations": {name: CONFIGURATIONS[name] for name in args.configurations},
            "command": "python scripts/zero_paper/mini_reproduction.py " + " ".join(portable_argv(argv)),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "launch_seconds": round(seconds, 1), "runs": results}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="scripts/zero_paper/mini_reproduction.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", help="the JSON file to write (never overwritten)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # the ranks' entry
    parser.add_argument("--layers", type=int, nargs=2, default=[4, 8], help="the two depths")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--bucket-size", type=int, default=200_000, help="reduce and all-gather buckets, elements")
    parser.add_argument("--configurations", nargs="+", choices=tuple(CONFIGURATIONS), default=list(CONFIGURATIONS))
    parser.add_argument("--data-cache-dir")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds the launch may take before it is stopped")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if not args.output:
        raise ConfigError("--output is required")
    output = Path(args.output)
    if output.exists():
        raise ConfigError(f"{output} exists; choose another --output")
    check_runs_fit(args)
    summary = reproduce(args, list(sys.argv[1:] if argv is None else argv))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {output} ({len(summary['runs'])} runs in one launch, {summary['launch_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool("scripts/zero_paper/mini_reproduction.py", main, (ConfigError,)))
