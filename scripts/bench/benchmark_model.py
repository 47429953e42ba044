#!/usr/bin/env python
"""Single-process CPU training throughput: our GPTModel against transformers' GPT2LMHeadModel, same run.

    python scripts/bench/benchmark_model.py --quick     # a tiny model: checks the script runs

Same shape, seed, batches and fp32 AdamW step (benchmark_gpu.py's trainers), in alternating rounds; tokens/s is
each one's best round. --profile adds each op's CPU time."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import benchmark_gpu  # noqa: E402  (puts the repository root on the path too)
from arguments.config import ModelConfig  # noqa: E402

QUICK_MODEL = ModelConfig.of(num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=64,
                          max_position_embeddings=64, vocab_size=benchmark_gpu.GPT2_VOCAB,
                          hidden_dropout=0.0, attention_dropout=0.0)


def cpu_name() -> str:
    """The CPU's model name as lscpu prints it (falls back to the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_side_by_side(trainers: list, batch: list[torch.Tensor], rounds: int, rows: int) -> str:
    """Self CPU time per op, ours beside hf, from each model's quickest of `rounds` profiled
    iterations (alternating): one whole iteration per model, so its ops add up, taken when the
    machine was least busy."""
    from torch.profiler import ProfilerActivity, profile

    quickest: dict[str, tuple[float, dict]] = {}
    for round_index in range(rounds):
        for trainer in (trainers if round_index % 2 == 0 else trainers[::-1]):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                trainer.step(batch)
            ops = {event.key: (event.self_cpu_time_total / 1e3, event.count) for event in prof.key_averages()}
            total = sum(milliseconds for milliseconds, _ in ops.values())
            if trainer.name not in quickest or total < quickest[trainer.name][0]:
                quickest[trainer.name] = (total, ops)
    (ours_total, ours), (hf_total, hf) = quickest["ours"], quickest["hf"]
    keys = sorted(set(ours) | set(hf), key=lambda key: -max(ours.get(key, (0.0,))[0], hf.get(key, (0.0,))[0]))
    lines = [f"self CPU time per op of each model's quickest of {rounds} profiled iterations",
             "| op | ours ms (calls) | hf ms (calls) | ours - hf ms |", "|---|---:|---:|---:|"]
    for key in keys[:rows]:
        (ours_ms, ours_calls), (hf_ms, hf_calls) = ours.get(key, (0.0, 0)), hf.get(key, (0.0, 0))
        lines.append(f"| {key} | {ours_ms:.1f} ({ours_calls}) | {hf_ms:.1f} ({hf_calls}) | {ours_ms - hf_ms:+.1f} |")
    lines.append(f"| total self CPU | {ours_total:.1f} | {hf_total:.1f} | {ours_total - hf_total:+.1f} |")
    return "\n".join(lines)


def time_interleaved(trainers: list, batches: list[list[torch.Tensor]], rounds: int) -> list[dict]:
    """One untimed iteration per trainer, then `rounds` rounds of one timed iteration each, the order
    alternating: wall-clock and process CPU seconds, and the loss, of every timed iteration."""
    results = {trainer.name: {"impl": trainer.name, "compiled": False, "step_times_s": [], "cpu_times_s": [],
                              "losses": [], "parameters": sum(p.numel() for p in trainer.model.parameters())}
               for trainer in trainers}
    for trainer in trainers:
        trainer.step(batches[0])
    for round_index in range(rounds):
        for trainer in (trainers if round_index % 2 == 0 else trainers[::-1]):
            result = results[trainer.name]
            began_wall, began_cpu = time.perf_counter(), time.process_time()
            loss = float(trainer.step(batches[(round_index + 1) % len(batches)]))
            result["step_times_s"].append(time.perf_counter() - began_wall)
            result["cpu_times_s"].append(time.process_time() - began_cpu)
            result["losses"].append(loss)
            print(f"  round {round_index + 1}/{rounds} {trainer.name:4s} {result['step_times_s'][-1] * 1e3:9.1f} ms "
                  f"({result['cpu_times_s'][-1] * 1e3:9.1f} ms CPU)  loss {loss:.3f}  load average "
                  f"{os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    return [results[trainer.name] for trainer in trainers]


def format_table(results: list[dict], tokens_per_iteration: int) -> str:
    lines = ["| model | parameters | tokens/iteration | best ms/iteration | median ms/iteration | "
             "median CPU ms/iteration | tokens/s (best) | GFLOP/s (best) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        lines.append(f"| {result['impl']} | {result['parameters']:,} | {tokens_per_iteration} | "
                     f"{result['best_step_s'] * 1e3:.1f} | {statistics.median(result['step_times_s']) * 1e3:.1f} | "
                     f"{statistics.median(result['cpu_times_s']) * 1e3:.1f} | {result['tokens_per_s']:,.1f} | "
                     f"{result['tflops'] * 1e3:.1f} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="gpt2-124m", help="a preset in configs/models (its layers, hidden size, heads)")
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--micro-batch-size", type=int, default=4, help="sequences per iteration")
    p.add_argument("--rounds", type=int, default=6, help="rounds of one timed iteration per model")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads; 0: torch's choice")
    p.add_argument("--profile", action="store_true", help="then print each op's self CPU time, ours beside hf")
    p.add_argument("--profile-rounds", type=int, default=3)
    p.add_argument("--profile-rows", type=int, default=25)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--quick", action="store_true",
                   help="2 layers, hidden 128, sequence 64, 6 rounds: checks the script runs")
    args = p.parse_args(argv)
    for name in ("rounds", "micro_batch_size", "profile_rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.quick:
        name, config = "quick", QUICK_MODEL
        args.rounds = 6
    else:
        name = args.model
        config = benchmark_gpu.model_config(args.model, args.seq_length)
    machine = f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    print(f"> torch {torch.__version__} on {machine}; {name}: {config.num_layers} layers, hidden "
          f"{config.hidden_size}, {config.num_attention_heads} heads, {args.micro_batch_size} x {config.seq_length} "
          f"tokens per iteration, fp32; load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    generator = torch.Generator().manual_seed(args.seed)
    batches = [[torch.randint(0, benchmark_gpu.GPT2_VOCAB, (args.micro_batch_size, config.seq_length + 1),
                              generator=generator)] for _ in range(4)]
    trainers = [benchmark_gpu.BUILDERS[impl](config, torch.device("cpu"), torch.float32, args.seed)
                for impl in ("ours", "hf")]
    results = time_interleaved(trainers, batches, args.rounds)
    for result in results:
        result.update(micro_batch_size=args.micro_batch_size, accumulation_steps=1, seq_length=config.seq_length)
    benchmark_gpu.add_throughput(results, config, peak=None)
    ours, hf = results
    cpu_ratio = statistics.median(hf["cpu_times_s"]) / statistics.median(ours["cpu_times_s"])
    profile_table = profile_side_by_side(trainers, batches[0], args.profile_rounds, args.profile_rows) if args.profile else None
    load = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "torch": torch.__version__, "model": name,
                                               "load_average": load, "rows": results}, indent=1))
    if profile_table:
        print(profile_table)
    print(f"{machine}; load average after the run {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.rounds} "
          f"interleaved rounds of one iteration each")
    print(f"ours/hf by median CPU time per iteration: {cpu_ratio:.2f}")
    print(format_table(results, args.micro_batch_size * config.seq_length))
    print(f"ours/hf tokens/s ratio: {ours['ours_over_hf']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
