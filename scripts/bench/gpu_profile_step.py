#!/usr/bin/env python
"""Where a training iteration's time goes on a GPU: pretrain_gpt.py under torch.profiler, per iteration the wall time,
the GPU's busy time, the kernels and the host's waits on the device. Busy time well under the wall time with many
syncs means the host is the bound.

    python scripts/bench/gpu_profile_step.py --label fp8 --table-run llama-1.2b/fp8-tensorwise -- --num-layers 4"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense",
         "aten::item", "cudaMemcpyAsync")


def profile_run(train_argv: list[str], skip: int, active: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    import pretrain_gpt
    from training import train_step

    step_times: list[float] = []
    original = train_step.DataParallelTrainStep.__call__
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=max(skip - 1, 0), warmup=1, active=active)) as profiler:
        def stepped(self, *args, **kwargs):
            began = time.perf_counter()
            result = original(self, *args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - began)
            profiler.step()
            return result

        train_step.DataParallelTrainStep.__call__ = stepped
        try:
            status = pretrain_gpt.main(train_argv)
        finally:
            train_step.DataParallelTrainStep.__call__ = original
    kernels: Counter = Counter()
    kernel_us: Counter = Counter()
    host: Counter = Counter()
    for event in profiler.events():
        # the profiler's own step ranges appear on the device's timeline too: they are not kernels
        if str(getattr(event, "device_type", "")).endswith("CUDA") and not event.name.startswith("ProfilerStep"):
            kernels[event.name] += 1
            kernel_us[event.name] += event.time_range.elapsed_us()
        elif event.name in SYNCS:
            host[event.name] += 1
    timed = step_times[skip:skip + active]
    return {"status": status, "iteration_ms": [round(1000 * t, 1) for t in timed],
            "gpu_busy_ms_per_iteration": round(sum(kernel_us.values()) / 1000 / active, 1),
            "kernels_per_iteration": sum(kernels.values()) // active,
            "host_waits_per_iteration": {name: count // active for name, count in host.items()},
            "top_kernels_ms_per_iteration": [(name[:90], kernels[name] // active, round(us / 1000 / active, 1))
                                             for name, us in kernel_us.most_common(12)]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--skip", type=int, default=3, help="iterations before the recorded ones")
    parser.add_argument("--active", type=int, default=2, help="iterations recorded")
    parser.add_argument("--output", default=None, help="append the run's JSON line here")
    parser.add_argument("--table-run", default=None, help="shape/variant of scripts/bench/gpu_side_by_side.py's table")
    parser.add_argument("train_argv", nargs=argparse.REMAINDER, help="-- then pretrain_gpt.py's arguments")
    args = parser.parse_args(argv)
    train_argv = args.train_argv[1:] if args.train_argv[:1] == ["--"] else args.train_argv
    if args.table_run:
        sys.path.insert(0, str(REPO_ROOT / "scripts" / "bench"))
        from gpu_side_by_side import plan_runs

        run = plan_runs(ordered=[args.table_run])[0]
        train_argv = ["--device", "cuda", *run.argv(False, args.skip + args.active + 1), *train_argv]
    result = {"label": args.label, **profile_run(train_argv, args.skip, args.active)}
    line = json.dumps(result)
    print(f"PROFILE {line}", flush=True)
    if args.output:
        with open(args.output, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    return 0 if result["status"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
