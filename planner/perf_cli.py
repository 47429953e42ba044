"""`python -m zero.perf_model`: the performance model's command line, predicting one configuration's iteration or
fitting the constants with --calibrate. It joins the model to its calibration, so neither imports the other's caller."""

from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

from base.errors import ConfigError, OneLineArgumentParser, run_tool
from planner.dry_run import dry_run
from planner.perf_calibration import calibrate_command
from planner.perf_model import format_prediction, load_constants, load_hardware, predict
from planner.plan import parse_planner
from planner.vocabulary import launch_vocab

USAGE = """Iteration time and TFLOP/s per GPU, predicted from a dry run (planner/dry_run.py) on a hardware profile.

`python -m zero.plan dry-run --hardware P` prints this model's figure only where P has no layout calibration
(dgx2-v100, cpu-2core); where it has one (h100-sxm), the layout model's (planner/layout_prediction.py).
    python -m zero.perf_model --hardware dgx2-v100 [zero.plan dry-run flags]     # one prediction
    python -m zero.perf_model --hardware h100-sxm --calibrate RUN/metrics.jsonl docs/h100-benchmark-gpu-mb1.json

Per rank and iteration, each term from the dry run's counts and the profile (configs/hardware/*.yaml): compute (every
GEMM of forward, backward and recompute at GEMM_EFFICIENCY of the dense peak, FP8 linears at the FP8 peak, plus
moving its operands through HBM, so thin GEMMs fall off the peak by the hardware's FLOP-per-byte ratio; the
memory-bound kernels, ELEMENTWISE_PASSES x b s h per layer and pass; the loss's softmax; Adam over the partition);
TP traffic (at the intra- or inter-node link, never overlapped: what collapses Megatron beyond one DGX-2 in Figure
2); DP traffic (reductions hide behind backward up to DP_OVERLAP; gathers after the step do not, unless
--overlap-param-gather); P_a+cpu (2 x the host bytes per micro-batch at PCIe speed); pipeline (the stage's compute,
the bubble (P - 1) / vp micro-batches, Narayanan et al. 2021 section 2.2, and the p2p sends on the critical path).

Three named constants (`Constants`), each from a calibration file (configs/hardware/calibrations/) that says what it
was fitted to: GEMM_EFFICIENCY, ELEMENTWISE_PASSES and DP_OVERLAP; everything else is a specification or a count.
`--calibrate` fits them to real runs (planner/perf_calibration.py)."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    own = OneLineArgumentParser(prog="python -m zero.perf_model", add_help=False)
    own.add_argument("--hardware", required=True, help="a profile in configs/hardware (or a YAML path)")
    own.add_argument("--constants", help="a calibration in configs/hardware/calibrations (default: the profile's)")
    own.add_argument("--calibrate", nargs="+", metavar="FILE",
                     help="fit the constants to these runs: metrics.jsonl files (each beside its launch.json) "
                          "or scripts/bench/benchmark_gpu.py --json outputs")
    own.add_argument("--output", help="with --calibrate: write the fitted constants to this YAML file")
    args, rest = own.parse_known_args(argv)
    hardware = load_hardware(args.hardware)
    if args.calibrate:
        return calibrate_command(args.calibrate, hardware, args.output, argv)
    constants = load_constants(args.constants or hardware.calibration)
    # the profile decides the node size and the attention kernel
    planner, parsed, cluster = parse_planner(
        [*rest, "--gpus-per-node", str(hardware.gpus_per_node), "--target", hardware.device_type],
        "python -m zero.perf_model")
    config = parsed.config
    vocab, _ = launch_vocab(config.checkpoint, config.data, config.model, config.sources)
    plan = dry_run(config, cluster, vocab, planner.rank)
    prediction = predict(plan, config, vocab, cluster.world_size, hardware, constants)
    print(json.dumps(prediction.to_json()) if planner.json else format_prediction(prediction, hardware, constants))
    return 0


def command(argv: Optional[Sequence[str]] = None) -> int:
    """`main` behind the entry-point boundary: exit status 0, or 2 with one line on stderr."""
    return run_tool("python -m zero.perf_model", lambda: main(argv), (ConfigError,))
