#!/usr/bin/env python
"""The host's cost of issuing one transformer layer's forward and backward per micro-batch, for a hardware profile's
`host_forward_ms_per_layer` and `host_backward_ms_per_layer` (planner/layout_perf.py).

    python scripts/bench/probe_host_overhead.py --device cuda --model="--config gpt2-350m --bf16"

Steps of M and 2M micro-batches of negligible device work, with and without full recompute, give forward and
backward per layer by difference."""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from arguments.config import ConfigError  # noqa: E402
from base.errors import OneLineArgumentParser, run_tool  # noqa: E402
from scripts.timed_launch import step_times  # noqa: E402

RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]


def median_step_s(argv: Sequence[str], ranks: int, skip: int, scratch: Path) -> float:
    steps = step_times(argv, ranks, scratch, f"pretrain_gpt.py {shlex.join(argv)}", one_thread=ranks > 1)
    return statistics.median(steps[skip:])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="scripts/bench/probe_host_overhead.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the model's pretrain_gpt.py flags, one string")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ranks", type=int, default=1,
                        help="data-parallel ranks run at once (a CPU profile's ranks share its cores), one thread each")
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=8, help="M: steps of M and 2M micro-batches are timed")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--skip", type=int, default=3)
    parser.add_argument("--data-cache-dir", default=None)
    parser.add_argument("--output", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.iterations <= args.skip:
        raise ConfigError(f"--iterations {args.iterations} with --skip {args.skip}: no steady step is left")
    from arguments.parser import parse_config

    model = shlex.split(args.model)
    layers = parse_config(model).model.num_layers
    cache_dir = args.data_cache_dir or str(Path.home() / ".cache" / "zero-gpt")
    common = [*model, "--device", args.device, "--seq-length", str(args.seq_length), "--max-position-embeddings",
              str(max(args.seq_length, parse_config(model).model.max_position_embeddings or 0)),
              "--micro-batch-size", "1", "--train-iters", str(args.iterations), "--log-interval", "1",
              "--eval-iters", "0", "--lr-warmup-iters", "0", "--data-cache-dir", cache_dir]
    steps: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for recompute in (False, True):
            for count in (args.micro_batches, 2 * args.micro_batches):
                name = f"{'full' if recompute else 'none'}_{count}"
                steps[name] = median_step_s([*common, "--global-batch-size", str(count * args.ranks),
                                             *(RECOMPUTE if recompute else [])], args.ranks, args.skip, Path(scratch))
                print(f"recompute {'full' if recompute else 'none'}, {count} micro-batches: "
                      f"{steps[name] * 1e3:.1f} ms a step", flush=True)
    m = args.micro_batches
    plain = (steps[f"none_{2 * m}"] - steps[f"none_{m}"]) / m
    recomputed = (steps[f"full_{2 * m}"] - steps[f"full_{m}"]) / m
    forward = (recomputed - plain) / layers
    backward = plain / layers - forward
    print(f"host_forward_ms_per_layer: {forward * 1e3:.3f}    # {layers} layers, {plain * 1e3:.1f} ms a micro-batch "
          f"({recomputed * 1e3:.1f} with full recompute)")
    print(f"host_backward_ms_per_layer: {backward * 1e3:.3f}")
    if args.output:
        given = list(argv if argv is not None else sys.argv[1:])
        command = "python scripts/bench/probe_host_overhead.py " + shlex.join(given)
        Path(args.output).write_text(json.dumps({
            "command": command, "layers": layers, "ranks": args.ranks, "steps_s": {k: round(v, 5) for k, v in steps.items()},
            "per_micro_batch_ms": round(plain * 1e3, 3), "per_micro_batch_recompute_ms": round(recomputed * 1e3, 3),
            "host_forward_ms_per_layer": round(forward * 1e3, 4),
            "host_backward_ms_per_layer": round(backward * 1e3, 4)}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool("scripts/bench/probe_host_overhead.py", main, (ConfigError,)))
