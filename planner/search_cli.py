"""`python -m zero.plan search`: its own flags, the trainer's flags for the model (a layout flag among them fixes that
dimension), the search, the dry-run check of its picks and the report; where no layout fits, the smallest GPU count that
does and the closest lever."""

from __future__ import annotations

import json
import time
from typing import Sequence

from arguments.bounds import MIN_PARAMETER_BYTES, parameter_lower_bound
from arguments.config import PretrainConfig
from arguments.parser import build_parser, parse_arguments
from base.errors import OneLineArgumentParser
from planner.input_bounds import check_gpu_count, check_model_fits_gpus, check_search_counts
from planner.layout_flags import drop_no_effect_flags, launch_command, planned_batch_flags
from planner.layout_perf import ModelCounts
from planner.layout_pins import pins_of
from planner.layout_search import Candidate, search, smallest_fitting_gpus
from planner.levers import plainest_layout, search_levers
from planner.perf_model import Hardware, load_hardware
from planner.search_check import check_picks
from planner.search_progress import SearchProgress
from planner.search_report import answer_terms, explain_losses, format_picks, no_fit_lines
from planner.vocabulary import launch_vocab

MODEL_FLAGS_NOTE = ("Every other flag is pretrain_gpt.py's (the model: --config, --init-from-hf or the shape flags; "
                    "--global-batch-size, --seq-length; data and checkpoint flags, passed on to the printed commands); "
                    "a layout flag among them (--tensor-model-parallel-size, --zero-stage, --bf16, "
                    "--recompute-granularity, --expert-model-parallel-size, --sequence-parallel, ...) fixes that "
                    "dimension. `--help-model` lists them.")


def search_arguments() -> OneLineArgumentParser:
    own = OneLineArgumentParser(prog="python -m zero.plan search", add_help=False,
                                description="Every layout of a model on N GPUs, ranked by the layout model's step "
                                            "time; the best checked by the dry run; each printed as a command.",
                                epilog=MODEL_FLAGS_NOTE)
    own.add_argument("--gpus", type=int, required=True, help="GPUs in the job")
    own.add_argument("--hardware", required=True, help="a profile in configs/hardware with a layout calibration "
                                                       "(h100-sxm, cpu-2core-4proc)")
    own.add_argument("--top", type=int, default=5, help="layouts printed (default 5)")
    own.add_argument("--json", action="store_true", help="every layout that fits, best first, as JSON")
    own.add_argument("--no-dry-run-check", dest="dry_run_check", action="store_false",
                     help="print the picks by the analytic count alone, without planning them by the dry run "
                          "(faster for large models; the count runs under the dry run's figure)")
    own.add_argument("--max-dry-runs", type=int, default=20, metavar="N",
                     help="plan at most N candidates by the dry run while looking for --top that fit (default 20)")
    own.add_argument("-h", "--help", action="store_true", help="this help")
    own.add_argument("--help-model", action="store_true", help="pretrain_gpt.py's flags, which give the model")
    return own


def data_note(config) -> list[str]:
    """Where the printed commands get their data and save to: the user's flags, or what to add."""
    if config.data.user_data and config.checkpoint.save:
        return []
    missing = [what for what, given in (("--data-path with its tokenizer flags", config.data.user_data),
                                        ("--save DIR", config.checkpoint.save)) if not given]
    return [f"as printed, each command {'trains on the embedded corpus' if not config.data.user_data else 'reads your data'}"
            f" and {'saves nothing' if not config.checkpoint.save else 'saves where you said'}: add "
            f"{' and '.join(missing)} (docs/data.md), or give them to search, which passes them on"]


# a dry run takes about 0.1 s a layer on a CI core: the no-fit answer confirms by dry run only up to this depth
CONFIRM_MAX_LAYERS = 24
CONFIRM_DRY_RUNS = 3


def no_fit_answer(config: PretrainConfig, counts: ModelCounts, gpus: int, hardware: Hardware, vocab: int,
                  model_flags: list[str], candidates: list[Candidate], dry_run_check: bool,
                  progress: SearchProgress) -> list[str]:
    """Where no layout fits: the smallest GPU count that does (confirmed by the dry run where cheap) and the lever that
    gets closest on `gpus`."""
    progress.emit(f"search: no layout fits on {gpus:,} GPUs; looking for the smallest count that fits")
    parameters, _ = parameter_lower_bound(config.model)
    smallest = smallest_fitting_gpus(config, counts, gpus, hardware, parameters * MIN_PARAMETER_BYTES)
    checked = "by the count"
    if smallest is not None and not dry_run_check:
        checked += "; not checked by the dry run (--no-dry-run-check)"
    elif smallest is not None and config.model.num_layers > CONFIRM_MAX_LAYERS:
        checked += (f"; not checked by the dry run, whose {config.model.num_layers} layers take tens of seconds: "
                    f"search --gpus {smallest[0]} checks it")
    elif smallest is not None:
        _, found = search(config, smallest[0], hardware, vocab)
        summary = check_picks(found, model_flags, hardware, 1, CONFIRM_DRY_RUNS)
        if summary.fit:
            checked, smallest = "by the count and the dry run", (smallest[0], found[0].layout)
        else:
            checked += f"; its best {summary.checked} by the dry run do not fit: more may be needed"
    layouts = [(c.layout, c.memory_bytes) for c in candidates]
    baseline = plainest_layout(layouts) if layouts else None
    levers = search_levers(layouts, *baseline) if baseline else []
    closest = min(candidates, key=lambda c: c.memory_bytes) if candidates else None
    return no_fit_lines(gpus, hardware.gpu_memory_bytes, config.model.seq_length, smallest, checked, closest,
                        baseline, levers)


def search_command(argv: Sequence[str]) -> int:
    own = search_arguments()
    if {"-h", "--help"} & set(argv):
        print(own.format_help())
        return 0
    if "--help-model" in argv:
        build_parser().print_help()
        return 0
    args, rest = own.parse_known_args(list(argv))
    check_gpu_count("--gpus", args.gpus)
    check_search_counts(args.top, args.max_dry_runs)
    parsed = parse_arguments(list(rest))
    config, hardware = parsed.config, load_hardware(args.hardware)
    check_model_fits_gpus(config.model, args.gpus, hardware.gpu_memory_bytes)
    model_flags, dropped = drop_no_effect_flags(rest, parsed.harvested or {})
    model_flags += planned_batch_flags(config.training, config.sources)
    start = time.perf_counter()
    # an --init-from-hf model's comes from its folder: the output layer counts
    vocab, _ = launch_vocab(config.checkpoint, config.data, config.model, config.sources)
    progress = SearchProgress()
    counts, candidates = search(config, args.gpus, hardware, vocab, progress)
    fitting = sum(c.fits for c in candidates)
    checked = "; not checked by the dry run (--no-dry-run-check): the count runs a few % under it"
    if args.dry_run_check:
        summary = check_picks(candidates, model_flags, hardware, args.top, args.max_dry_runs, progress)
        checked = (f"; the best planned by the dry run until {args.top} fit: {summary.checked} planned, "
                   f"{summary.fit} fit" + (f" (stopped at --max-dry-runs {args.max_dry_runs}: raise it to print "
                                           f"{args.top})" if summary.capped else ""))
    explain_losses(candidates)
    if args.json:
        print(json.dumps([c.to_json() | {"flags": c.launch_flags(model_flags),
                                         "command": launch_command(args.gpus, hardware.gpus_per_node,
                                                                   c.launch_flags(model_flags))}
                          for c in candidates if c.fits]))
        return 0
    no_fit = [] if any(c.fits for c in candidates) else \
        no_fit_answer(config, counts, args.gpus, hardware, vocab, model_flags, candidates, args.dry_run_check, progress)
    seconds = time.perf_counter() - start
    pins = pins_of(config)
    pinned = pins.names()
    header = (f"{len(candidates):,} layouts enumerated, {fitting:,} fit by the count{checked}; {seconds:.1f} s"
              + (f"; fixed by your flags: {', '.join(pinned)}" if pinned else ""))
    notes = no_fit + [answer_terms(config.model, config.training, config.sources, pins, hardware.precision == "fp32")] \
        + data_note(config) + ([f"left out of the commands: {' '.join(dropped)} (pretrain_gpt.py accepts "
                                  f"{'them' if len(dropped) > 1 else 'it'} with no effect)"] if dropped else [])
    print(format_picks(candidates, args.top, model_flags, hardware.gpus_per_node, hardware.gpu_memory_bytes, header,
                       notes, checked_only=args.dry_run_check))
    return 0
