"""Pretrain a GPT: config -> parallel state -> checks -> the run prepared once -> train. `python pretrain_gpt.py` trains
the tiny preset on the embedded corpus; bad input is one line on stderr and exit 2 before any work, and a rank that dies
or hangs is named by every survivor (exit 3).
"""

from __future__ import annotations

import os
import sys
from functools import partial
from typing import Optional, Sequence

from arguments.bounds import check_machine_bounds
from arguments.config import ConfigError, PretrainConfig
from arguments.parser import parse_arguments
from arguments.print_config import format_config
from base.errors import ALWAYS_EXPECTED, reporting_process, run_tool
from data import DataError
from parallel.launch_environment import read_launch_environment, use_openmpi_ranks
from parallel.state import ParallelState, initialize_grid
from planner.launch import RankPeak, dry_run_launch
from rendezvous.flight_recorder import torch_environment, with_environment_path
from resilience.fault_tolerance import FaultTolerance, start_fault_tolerance
from resilience.inprocess_restart import inprocess_notes, run_restarting
from resilience.stragglers import straggler_notes
from resilience.watched_run import flight_recorder_settings, run_watched
from training.data_splits import KeptAcrossRestarts
from training.late_checks import LATE_CHECKS
from training.loop import TrainingSummary
from training.memory_fit import check_memory_fits
from training.prepare import prepare
from training.run_training import train_run
from training.start_checks import check_before_claim, first_rank_log, kill_switch_found

PROGRAM = "pretrain_gpt.py"
EXPECTED_ERRORS = ALWAYS_EXPECTED + (DataError, KeyboardInterrupt)


def run(config: PretrainConfig, state: ParallelState, fault_tolerance: Optional[FaultTolerance] = None,
        kept: Optional[KeptAcrossRestarts] = None) -> TrainingSummary:
    """One training run in an initialized process group: the checks before any work, the run prepared once, then
    trained. `kept`: what an in-process restart keeps between incarnations."""
    log = first_rank_log(state)
    peak = RankPeak()  # one dry run of this rank serves the check and the memory line after iteration 1
    with state.comm.collective_work():  # an error on some ranks only ends every rank (parallel/comm.py)
        batch = check_before_claim(config, state, log)
        if (found := kill_switch_found(config.checkpoint, state, log)) is not None:
            return TrainingSummary(exit_reason=found)
        check_memory_fits(config, state, batch, peak.before_data, log)
    with prepare(config, state, batch, log, predict_peak=peak, kept=kept) as prepared:
        return train_run(prepared, fault_tolerance)


def exit_status(config: PretrainConfig, state: ParallelState, fault_tolerance: Optional[FaultTolerance] = None,
                kept: Optional[KeptAcrossRestarts] = None) -> int:
    """`run`'s exit status: what the runners of resilience/ (watched, restarting) take of it."""
    return run(config, state, fault_tolerance, kept).exit_code


def initialize_and_run(argv: Optional[Sequence[str]]) -> Optional[int]:
    """The process's exit status: 0 (None) unless the rerun state machine ended the job (16, 17)."""
    read_launch_environment()  # a bad RANK, WORLD_SIZE, MASTER_PORT, SLURM_* ...: one line before any work
    # What --load names is checked with the flags, so a launch's problems come back in one list.
    parsed = parse_arguments(argv, late_checks=LATE_CHECKS)
    config, notes = parsed.config, [*parsed.notes, *use_openmpi_ranks(parsed.config.training.faults.use_mpi),
                                    *straggler_notes(parsed.config.logging.log_straggler,
                                                     parsed.config.logging.disable_straggler_on_startup),
                                    *inprocess_notes(parsed.config.training)]
    if parsed.print_config:
        if reporting_process():
            print(format_config(parsed), flush=True)
        return
    if reporting_process():
        for note in notes:
            print(note if note.startswith(">") else f"> {note}", flush=True)
    if config.training.dry_run:
        for line in config.json_differences if reporting_process() else ():
            print(line, flush=True)
        dry_run_launch(config)
        return
    check_machine_bounds(config)  # before the process group, the data index or the model
    flight, said = with_environment_path(flight_recorder_settings(config.training.faults), os.environ)
    kept = torch_environment(flight, os.environ)  # NCCL reads them when its groups are made
    if kept:
        said.append(f"flight recorder: {', '.join(kept)} already set in the environment, kept (Megatron-LM's rule)")
    if reporting_process():
        for line in said:
            print(f"> {line}", flush=True)
    fault_tolerance = start_fault_tolerance(config.training.faults, config.checkpoint, read_launch_environment().rank)
    try:
        # the same processes through every fault (resilience/inprocess_restart.py)
        if config.training.faults.inprocess_restart:
            return run_restarting(config, partial(exit_status, kept=KeptAcrossRestarts()), PROGRAM, fault_tolerance)
        try:
            state = initialize_grid(config.training.device, config.parallel,
                                    config.training.faults.distributed_timeout_minutes,
                                    config.zero.distributed_optimizer_instances)
        except ValueError as error:  # a launch or device the config cannot run on
            raise ConfigError(str(error)) from None
        return run_watched(config, state, exit_status, PROGRAM, EXPECTED_ERRORS, flight, fault_tolerance)
    finally:
        if fault_tolerance is not None:
            fault_tolerance.close(finished=False)  # the monitor goes with the rank; nothing more to learn


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(PROGRAM, lambda: initialize_and_run(argv), (DataError,))


if __name__ == "__main__":
    sys.exit(main())
