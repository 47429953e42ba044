"""`python -m zero.perf_model`: the performance model's command line (predict one configuration's
iteration, or fit the constants with --calibrate). The model itself is planner/perf_model.py; this file
joins it to the calibration, which imports the model, so neither imports the other's caller."""

from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

from base.errors import ConfigError, OneLineArgumentParser, run_tool
from planner import perf_model
from planner.dry_run import dry_run
from planner.perf_calibration import calibrate_command
from planner.perf_model import format_prediction, load_constants, load_hardware, predict
from planner.plan import parse_planner
from planner.vocabulary import launch_vocab


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(perf_model.__doc__)
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
    # The profile decides the node size and the attention kernel; the rest are zero.plan's flags.
    planner, parsed, cluster = parse_planner(
        [*rest, "--gpus-per-node", str(hardware.gpus_per_node), "--target", hardware.device_type],
        "python -m zero.perf_model")
    config = parsed.config
    vocab, _ = launch_vocab(config)
    plan = dry_run(config, cluster, vocab, planner.rank)
    prediction = predict(plan, config, vocab, cluster.world_size, hardware, constants)
    print(json.dumps(prediction.to_json()) if planner.json else format_prediction(prediction, hardware, constants))
    return 0


def command(argv: Optional[Sequence[str]] = None) -> int:
    """`main` behind the entry-point boundary: exit status 0, or 2 with one line on stderr."""
    return run_tool("python -m zero.perf_model", lambda: main(argv), (ConfigError,))
