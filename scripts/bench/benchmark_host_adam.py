#!/usr/bin/env python
"""The offloaded optimizer's host step (zero/offload.py) against DeepSpeed's DeepSpeedCPUAdam.

    DS_ACCELERATOR=cpu python scripts/bench/benchmark_host_adam.py

One fp32 partition of --numel elements stepped with AdamW by torch's fused and foreach kernels and by DeepSpeed's,
same threads, in interleaved rounds: each one's median step, and the load average (the machine is shared)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, default=10_000_000, help="partition elements (default 1e7)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for every implementation")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (the median is reported)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps timed per round")
    args = parser.parse_args(argv)
    for name in ("numel", "threads", "rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def build(kind: str, numel: int, lr: float = 1e-3, weight_decay: float = 0.1):
    """(parameter, optimizer) for `kind`, on a partition drawn from a fixed seed."""
    import torch

    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(numel, generator=generator))
    param.grad = torch.randn(numel, generator=generator) * 1e-3
    if kind == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        optimizer = DeepSpeedCPUAdam([param], lr=lr, weight_decay=weight_decay, adamw_mode=True)
    else:
        optimizer = torch.optim.AdamW([param], lr=lr, weight_decay=weight_decay, **{kind: True})
    optimizer.step()  # the moments are allocated by the first step; it is not timed
    return param, optimizer


def deepspeed_available() -> str:
    """'' when DeepSpeedCPUAdam can be built here, else why not."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: F401
    except Exception as error:  # ImportError, or the JIT build's own errors
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return ""


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    kinds = ["fused", "foreach"]
    missing = deepspeed_available()
    if missing:
        print(f"> DeepSpeedCPUAdam is not available ({missing}): ours only", file=sys.stderr)
    else:
        kinds.append("deepspeed")
    load_before = os.getloadavg()
    print(f"> partition {args.numel:,} fp32 elements, {args.threads} thread(s), {args.rounds} rounds x {args.steps} "
          f"steps; torch {torch.__version__}; load average {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}; {os.cpu_count()} cores", flush=True)
    built = {kind: build(kind, args.numel) for kind in kinds}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for round_index in range(args.rounds):
        order = kinds[round_index % len(kinds):] + kinds[:round_index % len(kinds)]
        for kind in order:
            _, optimizer = built[kind]
            start = time.perf_counter()
            for _ in range(args.steps):
                optimizer.step()
            times[kind].append((time.perf_counter() - start) / args.steps)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    for kind in kinds:
        rate = args.numel / medians[kind] / 1e9
        print(f"  {kind:<10} median {medians[kind] * 1e3:8.2f} ms/step ({rate:.2f} G elements/s); rounds "
              + " ".join(f"{t * 1e3:.1f}" for t in times[kind]))
    if "deepspeed" in medians:
        for kind in ("fused", "foreach"):
            print(f"  ours/theirs ({kind} / DeepSpeedCPUAdam): {medians[kind] / medians['deepspeed']:.2f}")
    load_after = os.getloadavg()
    print(f"> load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
