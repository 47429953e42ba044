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

import os
import sys
from typing import Optional, Sequence

from arguments.bounds import check_machine_bounds
from arguments.config import ConfigError, PretrainConfig
from arguments.parser import parse_arguments
from arguments.print_config import format_config
from base.errors import (
    ALWAYS_EXPECTED,
    InjectedFault,
    PeerLostError,
    exit_at_once,
    one_line,
    reporting_process,
    run_tool,
)
from data import DataError
from parallel.failure_report import agree_on_failure
from parallel.flight_recorder import (
    FlightRecorder,
    FlightRecorderSettings,
    start_flight_recorder,
    torch_environment,
    with_environment_path,
)
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
from training.stragglers import straggler_notes

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


def initialize_and_run(argv: Optional[Sequence[str]]) -> Optional[int]:
    """The process's exit status: 0 (None) unless the rerun state machine ended the job (16, 17)."""
    read_launch_environment()  # a bad RANK, WORLD_SIZE, MASTER_PORT, SLURM_* ...: one line before any work
    # what --load names is checked with the flags, so every problem of a launch comes back in one list
    parsed = parse_arguments(argv, late_checks=LATE_CHECKS)
    config, notes = parsed.config, [*parsed.notes, *use_openmpi_ranks(parsed.config.training.use_mpi),
                                    *straggler_notes(parsed.config.logging.log_straggler,
                                                     parsed.config.logging.disable_straggler_on_startup)]
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
    flight, said = with_environment_path(flight_recorder_settings(config), os.environ)
    kept = torch_environment(flight, os.environ)  # NCCL reads them when its groups are made
    if kept:
        said.append(f"flight recorder: {', '.join(kept)} already set in the environment, kept (Megatron-LM's rule)")
    if reporting_process():
        for line in said:
            print(f"> {line}", flush=True)
    # Megatron-LM opens the "setup" section before initialize_megatron (training.py: ft_integration.setup())
    fault_tolerance = start_fault_tolerance(config, read_launch_environment().rank)
    try:
        return train_in_process_group(config, flight, fault_tolerance)
    finally:
        if fault_tolerance is not None:
            fault_tolerance.close(finished=False)  # the monitor goes with the rank; nothing more to learn


def train_in_process_group(config: PretrainConfig, flight: FlightRecorderSettings,
                           fault_tolerance: Optional[FaultTolerance]) -> int:
    try:
        state = initialize_grid(config.training.device, config.parallel, config.training.distributed_timeout_minutes,
                                config.zero.distributed_optimizer_instances)
    except ValueError as error:  # a launch or device the config cannot run on
        raise ConfigError(str(error)) from None
    liveness: Optional[Liveness] = None
    recorder: Optional[FlightRecorder] = None
    lost = own_error = False
    try:
        if flight.on:
            recorder = start_flight_recorder(flight, state.comm, state.rank, state.world_size,
                                             config.training.heartbeat_timeout_seconds)
        liveness = watch_peers(state, config.training.heartbeat_timeout_seconds, recorder)
        summary = run(config, state, fault_tolerance)
        if fault_tolerance is not None:  # every rank is here: the last learning of --calc-ft-timeouts
            fault_tolerance.close(finished=True)
        return summary.exit_code  # 16 or 17: the rerun state machine's (training/rerun_state.py)
    except EXPECTED_ERRORS + (InjectedFault,) as error:
        # Not a lost peer: an error met by every rank alike (the ranks agree on their checks), or by this rank
        # alone; the store decides who prints it (parallel/failure_report.py).
        if liveness is not None and not isinstance(error, KeyboardInterrupt):
            error.reporter = agree_on_failure(liveness.board.store, liveness.board.prefix, state.rank,
                                              state.world_size, one_line(error), state.place())
        raise
    except Exception:
        # Anything else on a multi-rank run may be a collective that failed because a peer is gone
        # (in the loop, an autograd hook, a work handle's wait): the heartbeats say whether one is.
        loss = liveness.explain_failure() if liveness is not None else None
        if loss is None:
            own_error = True
            if recorder is not None and liveness is not None and recorder.in_collective():
                # a collective's timeout with every peer alive: where each rank stands, above the traceback
                print(f"{PROGRAM}: " + recorder.report_failed_collective(
                    state.comm.iteration, liveness.board.store, liveness.board.prefix), file=sys.stderr, flush=True)
            elif recorder is not None:
                recorder.dump_on_error(state.comm.iteration)
            raise  # every peer is alive: this rank's own failure keeps its traceback
        lost = True
        raise PeerLostError(peer_lost_line(loss, state, recorder, liveness)) from None
    finally:
        if recorder is not None:
            recorder.stop()
        # Marked as left (and an error of this rank's own in the verdict) before the group goes, so
        # that the peers blocked on this rank read why; then the store's host waits for them to leave.
        if liveness is not None:
            liveness.stop(after_loss=lost, own_error=own_error)
        destroy(state)
        if liveness is not None:
            liveness.linger()


def watch_peers(state: ParallelState, heartbeat_timeout_seconds: float,
                recorder: Optional[FlightRecorder] = None) -> Optional[Liveness]:
    """This rank's heartbeat (parallel/liveness.py) on a multi-rank run; a peer found dead or stalled
    while the main thread may be blocked in a collective ends the process with the one line."""
    if state.world_size == 1:
        return None
    launch = read_launch_environment()
    started: list[Liveness] = []  # on_lost runs only once the watch has started

    def on_lost(loss: PeerLoss) -> None:
        exit_at_once(PROGRAM, PeerLostError(peer_lost_line(loss, state, recorder, started[0] if started else None)))

    started.append(start_liveness(state.rank, state.world_size, launch.master_addr, launch.master_port,
                                  stall_timeout_s=heartbeat_timeout_seconds, on_lost=on_lost))
    return started[0]


def peer_lost_line(loss: PeerLoss, state: ParallelState, recorder: Optional[FlightRecorder],
                   liveness: Optional[Liveness]) -> str:
    """The lost peer's line; with --flight-recorder-dump-path, every live rank dumps and the line goes on with
    where each group's ranks stand (parallel/flight_recorder.py), the live ranks' records shared through the
    rendezvous store unless it is the store that went."""
    line = loss.describe(state.rank, state.comm.where())
    if recorder is None:
        return line
    shares = liveness is not None and loss.store_host is None and loss.paused_for_s is None
    reason = "this rank did not run (stopped)" if loss.paused_for_s is not None else line
    analysis = recorder.report(reason, state.comm.iteration, loss.silent, loss.exited,
                               liveness.board.store if shares else None, liveness.board.prefix if shares else "")
    return f"{line}; {analysis}" if analysis else line


def flight_recorder_settings(config: PretrainConfig) -> FlightRecorderSettings:
    training = config.training
    return FlightRecorderSettings(
        dump_path=training.flight_recorder_dump_path, trace_buffer_size=training.flight_recorder_trace_buffer_size,
        dump_on_timeout=training.flight_recorder_dump_on_timeout,
        include_stack_trace=training.flight_recorder_include_stack_trace,
        include_only_active=training.flight_recorder_include_only_active,
        extra_dump_on_exec=training.flight_recorder_extra_dump_on_exec)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(PROGRAM, lambda: initialize_and_run(argv), (DataError,))


if __name__ == "__main__":
    sys.exit(main())
