#!/usr/bin/env python
"""Materializing a model under ZeRO stage 3: time and peak memory per rank, at DP=1 and DP=2.

    python scripts/bench/benchmark_init.py --quick     # a tiny model, to check the script runs

Fresh processes per configuration, so each rank's peak RSS is its own: init time, RSS growth over the model states
held (goal <= 1.3) and the DP=2 to DP=1 time ratio (goal <= 0.6)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parents[2]
RSS_GOAL, TIME_GOAL = 1.3, 0.6


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--num-layers", type=int, default=12)
    p.add_argument("--hidden-size", type=int, default=1024)
    p.add_argument("--num-attention-heads", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--seq-length", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=2, help="rounds per DP size, interleaved; best time counts")
    p.add_argument("--quick", action="store_true", help="a 2 x 128 model and one round: checks the script runs")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--rank-worker", default=None, help=argparse.SUPPRESS)  # internal: one rank
    args = p.parse_args(argv)
    if args.quick:
        args.num_layers, args.hidden_size, args.num_attention_heads, args.vocab_size = 2, 128, 4, 1000
        args.seq_length, args.rounds = 128, 1
    return args


# ----------------------------------------------------------------------------- one rank

def rank_worker(spec: dict) -> dict:
    """Runs in a rank process: build on meta, materialize through ZeRO stage 3, measure."""
    sys.path.insert(0, str(REPO_ROOT))
    import torch

    from arguments.config import ModelConfig, OptimizerConfig
    from gpt.model import GPTModel
    from parallel.state import destroy, initialize
    from zero.apply import build_zero
    from zero.config import ZeroConfig
    from zero.memory import measure_tensor_bytes

    torch.set_num_threads(1)
    state = initialize("cpu", 1)
    try:
        # Once per process, not per model: the imports torch.optim pulls in (torch._dynamo, ~5 s) and
        # the allocator's first arenas. A tiny model through the same path takes them out of the figures.
        tiny = ModelConfig.of(num_layers=1, hidden_size=8, num_attention_heads=1, seq_length=8,
                           max_position_embeddings=8, vocab_size=16)
        build_zero(GPTModel(tiny, state), ZeroConfig(stage=3), OptimizerConfig(), state, param_dtype=torch.bfloat16,
                   grad_dtype=torch.float32, seed=1)
        config = ModelConfig.of(**spec["model"])
        model = GPTModel(config, state)
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        started, cpu_started = time.perf_counter(), time.process_time()
        zero = build_zero(model, ZeroConfig(stage=3), OptimizerConfig(), state, param_dtype=torch.bfloat16,
                          grad_dtype=torch.float32, seed=1, blocks=model.blocks)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        held = measure_tensor_bytes(zero.optimizer.model_state_tensors())
        chunk = max(unit.numel for unit in zero.optimizer.layout.units) * 2  # bf16
        return {"rank": state.rank, "seconds": seconds, "cpu_seconds": cpu_seconds, "rss_growth": peak_after - peak_before,
                "model_state_bytes": held["total"] + held.get("buffers", 0), "chunk_bytes": chunk,
                "parameters": zero.optimizer.layout.num_parameters}
    finally:
        destroy(state)


# ----------------------------------------------------------------------------- orchestration

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(world_size: int, spec: dict) -> list[dict]:
    """`world_size` fresh rank processes with torchrun's environment; their results in rank order."""
    port = free_port()
    processes = []
    with tempfile.TemporaryDirectory() as out:
        for rank in range(world_size):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
                       OMP_NUM_THREADS="1")
            result = Path(out) / f"rank{rank}.json"
            processes.append((subprocess.Popen([sys.executable, str(SCRIPT), "--rank-worker",
                                                json.dumps({**spec, "out": str(result)})], env=env), result))
        for process, _ in processes:
            if process.wait() != 0:
                raise SystemExit(f"benchmark_init.py: a rank of the DP={world_size} run failed (exit "
                                 f"{process.returncode}); its error is above")
        return [json.loads(result.read_text()) for _, result in processes]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rank_worker is not None:
        spec = json.loads(args.rank_worker)
        Path(spec["out"]).write_text(json.dumps(rank_worker(spec)))
        return 0
    spec = {"model": {"num_layers": args.num_layers, "hidden_size": args.hidden_size,
                      "num_attention_heads": args.num_attention_heads, "vocab_size": args.vocab_size,
                      "seq_length": args.seq_length, "max_position_embeddings": args.seq_length}}
    print(f"> {args.num_layers} layers x {args.hidden_size}, vocab {args.vocab_size}; load average "
          f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} cores", file=sys.stderr, flush=True)
    runs: dict[int, list[list[dict]]] = {1: [], 2: []}
    for round_index in range(args.rounds):
        for dp in ((1, 2) if round_index % 2 == 0 else (2, 1)):
            ranks = launch(dp, spec)
            runs[dp].append(ranks)
            print(f"  round {round_index + 1} DP={dp}: " + ", ".join(
                f"rank {r['rank']} {r['seconds']:.2f} s ({r['cpu_seconds']:.2f} s CPU), RSS +{r['rss_growth'] / 2**20:.0f} MiB"
                for r in ranks),
                file=sys.stderr, flush=True)

    best = {dp: min(rounds, key=lambda ranks: max(r["seconds"] for r in ranks)) for dp, rounds in runs.items()}
    lines = ["| DP | rank | init time (s) | CPU time (s) | peak RSS growth (MiB) | model states + one chunk (MiB) | ratio |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for dp, ranks in best.items():
        for r in ranks:
            budget = r["model_state_bytes"] + r["chunk_bytes"]
            ratio = r["rss_growth"] / budget
            ratios.append(ratio)
            lines.append(f"| {dp} | {r['rank']} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | {r['rss_growth'] / 2**20:.0f} | "
                         f"{budget / 2**20:.0f} | {ratio:.2f} |")
    time_ratio = max(r["seconds"] for r in best[2]) / max(r["seconds"] for r in best[1])
    cpu_best = {dp: min(max(r["cpu_seconds"] for r in ranks) for ranks in rounds) for dp, rounds in runs.items()}
    cpu_ratio = cpu_best[2] / cpu_best[1]
    if args.json:
        Path(args.json).write_text(json.dumps({"spec": spec, "runs": {str(k): v for k, v in runs.items()}}, indent=1))
    print("\n".join(lines))
    print(f"worst peak RSS growth / (model states + one chunk): {max(ratios):.2f} (goal <= {RSS_GOAL})")
    print(f"init time DP=2 / DP=1: wall {time_ratio:.2f}, CPU {cpu_ratio:.2f} (goal <= {TIME_GOAL}; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
