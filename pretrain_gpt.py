"""Pretrain a GPT: config -> parallel state -> checks -> the run prepared once (training/prepare.py) -> train.

    python pretrain_gpt.py                          # the tiny preset on the embedded corpus
    python pretrain_gpt.py --config gpt2-124m --data-path my_text_document --vocab-file vocab.json \
        --merge-file merges.txt

Bad input (an unknown flag or YAML key, inconsistent sizes, unreadable data, an unwritable output, a save directory
another run owns, a damaged checkpoint) is one line on stderr, exit 2, before any work (checkpoint/run_start.py;
training/memory_fit.py: each rank's planned peak against the memory free). `--dry-run` prints what this rank would
hold and send (planner/plan.py). A rank that dies or hangs is named by every survivor, exit 3 (parallel/liveness.py).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from arguments.bounds import check_machine_bounds
from arguments.config import ConfigError, PretrainConfig
from arguments.parser import parse_arguments
from arguments.print_config import format_config
from base.errors import ALWAYS_EXPECTED, PeerLostError, exit_at_once, reporting_process, run_tool
from data import DataError
from parallel.liveness import Liveness, PeerLoss, start_liveness
from parallel.state import ParallelState, destroy, initialize_grid, read_launch_environment, use_openmpi_ranks
from planner.launch import RankPeak, dry_run_launch
from training.fault_tolerance import FaultTolerance, start_fault_tolerance
from training.late_checks import LATE_CHECKS
from training.loop import TrainingSummary
from training.memory_fit import check_memory_fits
from training.prepare import prepare
from training.run_training import train_run
from training.start_checks import check_before_claim, first_rank_log, kill_switch_found

PROGRAM = "pretrain_gpt.py"
EXPECTED_ERRORS = ALWAYS_EXPECTED + (DataError, KeyboardInterrupt)


def run(config: PretrainConfig, state: ParallelState, fault_tolerance: Optional[FaultTolerance] = None
        ) -> TrainingSummary:
    """One training run in an initialized process group: the checks before any work (training/start_checks.py,
    training/memory_fit.py), the run prepared once (training/prepare.py), then trained."""
    log = first_rank_log(state)
    batch = check_before_claim(config, state, log)
    if (found := kill_switch_found(config, state, log)) is not None:
        return TrainingSummary(exit_reason=found)
    peak = RankPeak()  # one dry run of this rank serves the check and the memory line after iteration 1
    check_memory_fits(config, state, batch, peak.before_data, log)
    with prepare(config, state, batch, log, predict_peak=peak) as prepared:
        return train_run(prepared, fault_tolerance)


def initialize_and_run(argv: Optional[Sequence[str]]) -> None:
    read_launch_environment()  # a bad RANK, WORLD_SIZE, MASTER_PORT, SLURM_* ...: one line before any work
    # what --load names is checked with the flags, so every problem of a launch comes back in one list
    parsed = parse_arguments(argv, late_checks=LATE_CHECKS)
    config, notes = parsed.config, [*parsed.notes, *use_openmpi_ranks(parsed.config.training.use_mpi)]
    if parsed.print_config:
        if reporting_process():
            print(format_config(parsed), flush=True)
        return
    if reporting_process():
        for note in notes:  # flags and JSON keys taken with no effect, and how Megatron's map here
            print(note if note.startswith(">") else f"> {note}", flush=True)
    if config.training.dry_run:
        dry_run_launch(config)
        return
    check_machine_bounds(config)  # before the process group, the data index or the model
    # Megatron-LM opens the "setup" section before initialize_megatron (training.py: ft_integration.setup())
    fault_tolerance = start_fault_tolerance(config, read_launch_environment().rank)
    try:
        train_in_process_group(config, fault_tolerance)
    finally:
        if fault_tolerance is not None:
            fault_tolerance.close(finished=False)  # the monitor goes with the rank; nothing more to learn


def train_in_process_group(config: PretrainConfig, fault_tolerance: Optional[FaultTolerance]) -> None:
    try:
        state = initialize_grid(config.training.device, config.parallel, config.training.distributed_timeout_minutes,
                                config.zero.distributed_optimizer_instances)
    except ValueError as error:  # a launch or device the config cannot run on
        raise ConfigError(str(error)) from None
    liveness: Optional[Liveness] = None
    lost = own_error = False
    try:
        liveness = watch_peers(state, config.training.heartbeat_timeout_seconds)
        run(config, state, fault_tolerance)
        if fault_tolerance is not None:  # every rank is here: the last learning of --calc-ft-timeouts
            fault_tolerance.close(finished=True)
    except EXPECTED_ERRORS:
        raise  # met by every rank alike (the ranks agree on their checks): not a lost peer
    except Exception:
        # Anything else on a multi-rank run may be a collective that failed because a peer is gone
        # (in the loop, an autograd hook, a work handle's wait): the heartbeats say whether one is.
        loss = liveness.explain_failure() if liveness is not None else None
        if loss is None:
            own_error = True
            raise  # every peer is alive: this rank's own failure keeps its traceback
        lost = True
        raise PeerLostError(loss.describe(state.rank, state.comm.where())) from None
    finally:
        # Marked as left (and an error of this rank's own in the verdict) before the group goes, so
        # that the peers blocked on this rank read why; then the store's host waits for them to leave.
        if liveness is not None:
            liveness.stop(after_loss=lost, own_error=own_error)
        destroy(state)
        if liveness is not None:
            liveness.linger()


def watch_peers(state: ParallelState, heartbeat_timeout_seconds: float) -> Optional[Liveness]:
    """This rank's heartbeat (parallel/liveness.py) on a multi-rank run; a peer found dead or stalled
    while the main thread may be blocked in a collective ends the process with the one line."""
    if state.world_size == 1:
        return None
    launch = read_launch_environment()

    def on_lost(loss: PeerLoss) -> None:
        exit_at_once(PROGRAM, PeerLostError(loss.describe(state.rank, state.comm.where())))

    return start_liveness(state.rank, state.world_size, launch.master_addr, launch.master_port,
                          stall_timeout_s=heartbeat_timeout_seconds, on_lost=on_lost)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(PROGRAM, lambda: initialize_and_run(argv), (DataError,))


if __name__ == "__main__":
    sys.exit(main())
