#!/usr/bin/env python
"""One-GPU training throughput of our GPTModel against transformers' GPT2LMHeadModel, same run.

    python scripts/bench/benchmark_gpu.py --smoke     # tiny, on the CPU (CI)

Both train the preset's shape on the same batches, rounds alternating, eager then compiled; a variant's figure is its
best round: tokens/s, TFLOP/s, MFU and peak memory, then a verdict against the goals."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import torch
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from arguments.config import ModelConfig, OptimizerConfig  # noqa: E402
from arguments.parser import resolve_preset  # noqa: E402
from base.errors import OneLineArgumentParser, run_tool  # noqa: E402
from base.options import setting_values, with_settings  # noqa: E402
from checkpoint.hf.folders import hf_config  # noqa: E402
from gpt.model import GPTModel  # noqa: E402
from parallel.state import ParallelState, resolve_device  # noqa: E402
from training.metrics import device_peak_tflops, flops_per_iteration, parameter_count  # noqa: E402
from zero.apply import build_zero  # noqa: E402
from zero.config import ZeroConfig  # noqa: E402
from zero.memory import measure_tensor_bytes  # noqa: E402

GPT2_VOCAB = 50257
DEFAULT_MODELS = ("gpt2-124m", "gpt2-350m", "gpt2-1.5b")
# Micro batches that keep both 1.5B models (about 24 GB of states each) and one's activations on an
# 80 GB GPU.
DEFAULT_MICRO_BATCH = {"gpt2-124m": 16, "gpt2-350m": 8, "gpt2-1.5b": 4}
MFU_GOAL, HF_RATIO_GOAL = 0.50, 1.10


class Trainer:
    """One model with its optimizer. `step(micro_batches)` is one training iteration: forward and
    backward of each [batch, seq+1] token tensor (gradients accumulate), then one optimizer step; it
    returns the mean loss."""

    def __init__(self, name: str, model: torch.nn.Module, step: Callable, blocks, state_tensors: Callable):
        self.name, self.model, self.step, self.blocks, self.state_tensors = name, model, step, blocks, state_tensors

    def compile(self) -> None:
        for block in self.blocks:
            block.compile()


def autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def flash_only(device: torch.device):
    """Our attention on the flash kernel, so a silent fall-back to a slower kernel is an error."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def build_ours(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int,
               use_autocast: bool = False) -> Trainer:
    """pretrain_gpt.py's path: built on the meta device, materialized by ZeRO (stage 0 on one rank)."""
    state = ParallelState(device=device)
    model = GPTModel(config, state)
    zero = build_zero(model, ZeroConfig(stage=0), OptimizerConfig(lr=1e-4, min_lr=0.0), state, param_dtype=dtype,
                      grad_dtype=torch.float32, seed=seed, blocks=model.blocks)

    def step(micro_batches: list[torch.Tensor]) -> torch.Tensor:
        zero.reducer.zero_grad()
        total = torch.zeros((), device=device)
        for index, tokens in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            with contextlib.nullcontext() if last else zero.reducer.no_sync():
                with autocast(device, dtype) if use_autocast else contextlib.nullcontext(), flash_only(device):
                    loss = model(tokens[:, :-1], tokens[:, 1:]).float().mean() / len(micro_batches)
                zero.scale_loss(loss).backward()
            zero.reducer.finish_grad_sync()
            total += loss.detach()
        zero.optimizer.step()
        return total

    def state_tensors() -> list[torch.Tensor]:
        return [t for tensors in zero.optimizer.model_state_tensors().values() for t in tensors]

    return Trainer("ours-autocast" if use_autocast else "ours", model, step, model.blocks, state_tensors)


def build_hf(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int) -> Trainer:
    from transformers import GPT2LMHeadModel

    hf = hf_config(config)
    hf._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT2LMHeadModel(hf)
    model.train()
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, **kernel)

    def step(micro_batches: list[torch.Tensor]) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for tokens in micro_batches:
            inputs = tokens[:, :-1]
            with autocast(device, dtype):
                # transformers shifts the labels itself: given the inputs it predicts tokens 1..s-1.
                # use_cache=False: training keeps no key/value cache (a cache also defeats torch.compile).
                loss = model(input_ids=inputs, labels=inputs, use_cache=False).loss / len(micro_batches)
            loss.backward()
            total += loss.detach()
        optimizer.step()
        return total

    def state_tensors() -> list[torch.Tensor]:
        tensors = [p.data for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
        for per_param in optimizer.state.values():
            tensors += [t for t in per_param.values() if torch.is_tensor(t)]
        return tensors

    return Trainer("hf", model, step, model.transformer.h, state_tensors)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resident_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one flat buffer count once)."""
    return measure_tensor_bytes({"parameters": tensors})["total"]


def run_round(trainer: Trainer, iterations: list[list[torch.Tensor]], warmup: int, steps: int,
              device: torch.device) -> tuple[float, list[float], int]:
    """(mean seconds per iteration, losses, peak bytes allocated above the start) of `warmup`
    untimed and `steps` timed iterations."""
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start_allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    for i in range(warmup):
        trainer.step(iterations[i % len(iterations)])
    synchronize(device)
    began = time.perf_counter()
    losses = [trainer.step(iterations[(warmup + i) % len(iterations)]) for i in range(steps)]
    synchronize(device)
    seconds = (time.perf_counter() - began) / steps
    above = torch.cuda.max_memory_allocated(device) - start_allocated if device.type == "cuda" else 0
    return seconds, [float(loss) for loss in losses], above


def profile_iteration(trainer: Trainer, iterations: list[list[torch.Tensor]], device: torch.device,
                      rows: int = 25) -> None:
    """Print the kernels of one iteration by total device time (stderr)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.step(iterations[0])
        synchronize(device)
    sort_by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(f"  profile of one {trainer.name} iteration:\n"
          + prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60),
          file=sys.stderr, flush=True)


def time_trainers(trainers: list[Trainer], spec: dict, iterations: list[list[torch.Tensor]],
                  device: torch.device) -> list[dict]:
    """Eager rounds, then (with --compile) compiled rounds, the trainers alternating round by round."""
    results = []
    for compiled in spec["compile_modes"]:
        if compiled:
            for trainer in trainers:
                trainer.compile()
                run_round(trainer, iterations, spec["warmup_steps"] + 2, 1, device)  # compiles here, untimed
        by_impl = {trainer.name: {"impl": trainer.name, "compiled": compiled, "step_times_s": [],
                                  "peak_memory_bytes": 0, "losses": [],
                                  "parameters": sum(p.numel() for p in trainer.model.parameters())}
                   for trainer in trainers}
        for round_index in range(spec["rounds"]):
            for trainer in (trainers if round_index % 2 == 0 else trainers[::-1]):
                result = by_impl[trainer.name]
                synchronize(device)
                held = resident_bytes(trainer.state_tensors())
                seconds, losses, above = run_round(trainer, iterations, spec["warmup_steps"], spec["steps"], device)
                result["step_times_s"].append(seconds)
                result["losses"] = losses
                result["peak_memory_bytes"] = max(result["peak_memory_bytes"], held + above)
                print(f"  round {round_index + 1}/{spec['rounds']} {trainer.name:4s} "
                      f"{'compiled' if compiled else 'eager':8s} {seconds * 1e3:8.1f} ms/iteration  "
                      f"loss {losses[-1]:.3f}", file=sys.stderr, flush=True)
        if spec["profile"]:
            for trainer in trainers:
                profile_iteration(trainer, iterations, device)
        results += list(by_impl.values())
    return results


BUILDERS = {"ours": build_ours, "hf": build_hf,
            "ours-autocast": lambda *args: build_ours(*args, use_autocast=True)}


def worker(spec: dict) -> list[dict]:
    """Build the implementations `spec["impls"]` names for one model size and time them (this runs in
    a fresh process per group, so each group starts with an empty device and its own peak)."""
    config = with_settings(ModelConfig, spec["model"])
    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    generator = torch.Generator().manual_seed(spec["seed"])
    shape = (spec["micro_batch_size"], config.seq_length + 1)
    iterations = [[torch.randint(0, GPT2_VOCAB, shape, generator=generator).to(device)
                   for _ in range(spec["accumulation_steps"])] for _ in range(4)]
    trainers = [BUILDERS[impl](config, device, dtype, spec["seed"]) for impl in spec["impls"]]
    return time_trainers(trainers, spec, iterations, device)


def fits_together(config: ModelConfig, device: torch.device) -> bool:
    """Whether both models' states (about 16 bytes a parameter each: 16-bit or fp32 weights and
    gradients, fp32 master and moments) take at most half the device, leaving the rest for one
    model's activations. Otherwise the two run one after the other, each in its own process."""
    if device.type != "cuda":
        return True
    states = 2 * 16 * parameter_count(config)
    return states <= 0.5 * torch.cuda.get_device_properties(device).total_memory


def run_worker(spec: dict) -> list[dict]:
    """`worker(spec)` in a fresh interpreter; its progress goes to our stderr."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    completed = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"benchmark_gpu.py: the {'+'.join(spec['impls'])} worker for {spec['name']} failed "
                         f"(exit {completed.returncode}); its error is above")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def benchmark_model(name: str, config: ModelConfig, micro_batch: int, args, device: torch.device,
                    dtype: torch.dtype) -> list[dict]:
    together = fits_together(config, device)
    print(f"> {name}: ours and transformers' GPT-2 ({config.num_layers} layers, hidden {config.hidden_size}), "
          f"{args.gradient_accumulation_steps} x micro batch {micro_batch} x {config.seq_length} tokens per "
          f"iteration; {'both resident, rounds alternate' if together else 'too large for both at once: one after the other'}",
          file=sys.stderr, flush=True)
    spec = {"name": name, "model": setting_values(config), "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "micro_batch_size": micro_batch, "accumulation_steps": args.gradient_accumulation_steps,
            "compile_modes": {"off": [False], "on": [True], "both": [False, True]}[args.compile],
            "rounds": args.rounds, "steps": args.steps, "warmup_steps": args.warmup_steps, "seed": args.seed,
            "profile": args.profile}
    impls = args.impls.split(",")
    groups = [impls] if together else [[impl] for impl in impls]
    results = [result for group in groups for result in run_worker({**spec, "impls": group})]
    for result in results:
        result.update(model=name, micro_batch_size=micro_batch, accumulation_steps=args.gradient_accumulation_steps,
                      seq_length=config.seq_length)
    return sorted(results, key=lambda r: (r["compiled"], impls.index(r["impl"])))


def format_table(rows: list[dict], device_name: str, peak: Optional[float]) -> str:
    lines = [f"device: {device_name}; dense 16-bit peak: {f'{peak:g} TFLOP/s' if peak else 'unknown'}",
             "| model | impl | compile | micro batch x accumulation | tokens/s | TFLOP/s | MFU | peak memory (GiB) | ours/hf |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        mfu = f"{row['mfu'] * 100:.1f}%" if row["mfu"] is not None else "-"
        ratio = f"{row['ours_over_hf']:.2f}x" if row.get("ours_over_hf") else ""
        lines.append(f"| {row['model']} | {row['impl']} | {'on' if row['compiled'] else 'off'} | "
                     f"{row['micro_batch_size']} x {row['accumulation_steps']} | {row['tokens_per_s']:,.0f} | "
                     f"{row['tflops']:.1f} | {mfu} | {row['peak_memory_bytes'] / 2**30:.2f} | {ratio} |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> str:
    largest = rows[-1]["model"]
    ours = [r for r in rows if r["model"] == largest and r["impl"] == "ours"]
    best = max(ours, key=lambda r: r["tokens_per_s"])
    mfu = best["mfu"]
    ratio = best.get("ours_over_hf")
    met = (mfu is not None and mfu >= MFU_GOAL) and ratio is not None and ratio >= HF_RATIO_GOAL
    mfu_text = f"{mfu * 100:.1f}% MFU" if mfu is not None else "MFU unknown (no peak for this device)"
    ratio_text = f"{ratio:.2f}x transformers' tokens/s" if ratio is not None else "transformers not run"
    return (f"verdict: {largest} ours ({'compiled' if best['compiled'] else 'eager'}) {mfu_text} "
            f"(goal >= {MFU_GOAL * 100:.0f}%), {ratio_text} (goal >= {HF_RATIO_GOAL:.1f}x): "
            f"{'goals met' if met else 'goals not met'}")


def _impls(text: str) -> str:
    unknown = [impl for impl in text.split(",") if impl not in BUILDERS]
    if unknown or not text:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or 'empty list'}: choose from {', '.join(BUILDERS)}")
    return text


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog="benchmark_gpu.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma list of presets in configs/models")
    p.add_argument("--micro-batch-size", type=int, default=None, help="default: per model, see the script")
    p.add_argument("--gradient-accumulation-steps", type=int, default=4,
                   help="micro batches per iteration (one optimizer step each iteration)")
    p.add_argument("--seq-length", type=int, default=None, help="default: the preset's")
    p.add_argument("--impls", default="ours,hf", type=_impls,
                   help=f"comma list of what to time, from {', '.join(BUILDERS)}")
    p.add_argument("--compile", choices=("off", "on", "both"), default="both")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="timed iterations per round")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed iterations before each round")
    p.add_argument("--profile", action="store_true", help="also print each variant's kernels for one iteration")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's dense 16-bit peak")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny model on the CPU in fp32 for 2 rounds of 2 iterations, eager only: checks the script runs")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one group, in a child process
    args = p.parse_args(argv)
    for name in ("rounds", "steps", "gradient_accumulation_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def model_config(preset: str, seq_length: Optional[int]) -> ModelConfig:
    values = yaml.safe_load(resolve_preset(preset).read_text(encoding="utf-8"))
    config = ModelConfig.of(num_layers=values["num_layers"], hidden_size=values["hidden_size"],
                         num_attention_heads=values["num_attention_heads"],
                         seq_length=values.get("seq_length", 1024),
                         max_position_embeddings=values.get("max_position_embeddings", 1024),
                         vocab_size=GPT2_VOCAB, hidden_dropout=0.0, attention_dropout=0.0)
    if seq_length is not None:
        config = replace(config, seq_length=seq_length, max_position_embeddings=max(seq_length, config.max_position_embeddings))
    return config


def add_throughput(results: list[dict], config: ModelConfig, peak: Optional[float]) -> None:
    """tokens/s, model TFLOP/s and MFU from each variant's best round; ours/hf per compile mode."""
    hf_by_mode = {r["compiled"]: r for r in results if r["impl"] == "hf"}
    for result in results:
        result["best_step_s"] = min(result["step_times_s"])
        tokens = result["micro_batch_size"] * result["accumulation_steps"]
        vocab = config.padded_vocab_size() if result["impl"].startswith("ours") else GPT2_VOCAB
        flops = flops_per_iteration(config, tokens, padded_vocab_size=vocab)
        result["tokens_per_s"] = tokens * config.seq_length / result["best_step_s"]
        result["tflops"] = flops / result["best_step_s"] / 1e12
        result["mfu"] = result["tflops"] / peak if peak else None
    for result in results:
        if result["impl"].startswith("ours") and result["compiled"] in hf_by_mode:
            result["ours_over_hf"] = result["tokens_per_s"] / hf_by_mode[result["compiled"]]["tokens_per_s"]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.smoke:
        args.device, args.compile, args.rounds, args.steps, args.warmup_steps = "cpu", "off", 2, 2, 1
        configs = [("smoke", ModelConfig.of(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                                          max_position_embeddings=32, vocab_size=GPT2_VOCAB, hidden_dropout=0.0,
                                          attention_dropout=0.0), args.micro_batch_size or 2)]
    else:
        configs = [(name, model_config(name, args.seq_length), args.micro_batch_size or DEFAULT_MICRO_BATCH.get(name, 4))
                   for name in args.models.split(",") if name]
    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        peak = args.peak_tflops or device_peak_tflops(device_name)
    else:
        device_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
        peak = args.peak_tflops
    print(f"> torch {torch.__version__} on {device_name}; {str(dtype).replace('torch.', '')}; load average "
          f"{os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)

    rows = []
    for name, config, micro_batch in configs:
        results = benchmark_model(name, config, micro_batch, args, device, dtype)
        add_throughput(results, config, peak)
        rows += results
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name, "peak_tflops": peak, "torch": torch.__version__,
                                               "rows": rows}, indent=1))
    print(format_table(rows, device_name, peak))
    print(verdict(rows))
    return 0


if __name__ == "__main__":
    sys.exit(run_tool("benchmark_gpu.py", main))  # bad flags and inputs: one line, exit 2
