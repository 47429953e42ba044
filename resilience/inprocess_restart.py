"""--inprocess-restart: training re-run in the same processes after a fault, as Megatron-LM wraps `pretrain` in
nvidia-resiliency-ext's Wrapper, built on torch.distributed alone. Each incarnation assigns ranks (hot spares take gone
ones), builds its process group on the restart store, and reloads from the latest checkpoint."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Optional

from arguments.config import ConfigError, PretrainConfig, TrainingConfig
from base.errors import PeerLostError, one_line
from checkpoint.format import TRACKER_FILE
from data import DataError
from parallel.launch_environment import read_launch_environment
from parallel.state import ParallelState, destroy, initialize_grid
from rendezvous.connection_abort import shut_down_connections
from rendezvous.rank_assignment import Assignment, TooFewProcesses, first_assignment, reassign
from rendezvous.restart_store import RestartStore
from resilience.fault_tolerance import FaultTolerance
from resilience.restart_progress import INPROCESS_MAX_ITERATIONS, INPROCESS_RESTART
from resilience.watched_run import RunOnGrid

# Bad input fails the same way in every incarnation: reported once (exit 2), never restarted.
NOT_RESTARTED = (ConfigError, DataError)


# Megatron-LM hands RetryController no bound, so a fault met at every restart restarts for ever: bounded here by
# default.
DEFAULT_MAX_INCARNATIONS = 10


class RestartsExhausted(PeerLostError):
    """Too many incarnations or too few processes: exit 3, as a lost peer without --inprocess-restart. The lowest live
    launch rank prints the line."""

    def __init__(self, message: str, speaks: bool = True) -> None:
        super().__init__(message)
        self.speaks = speaks


def incarnation_bound(training: TrainingConfig) -> int:
    return training.faults.inprocess_max_iterations or DEFAULT_MAX_INCARNATIONS


def inprocess_notes(training: TrainingConfig) -> list[str]:
    """The start-up lines where --inprocess-restart differs from Megatron-LM's."""
    if not training.faults.inprocess_restart:
        return []
    bound = incarnation_bound(training)
    notes = [f"in-process restart: a failed incarnation is re-run in the same processes (at most {bound} "
             f"incarnations); a process is gone when its heartbeat (every "
             f"{training.faults.inprocess_heartbeat_interval:g} s) is {training.faults.inprocess_heartbeat_timeout:g} s "
             f"old; the heartbeat watch of --heartbeat-timeout-seconds "
             f"and the flight recorder are off under it (its heartbeats serve)"]
    given = "" if training.faults.inprocess_max_iterations is None else f" {training.faults.inprocess_max_iterations}"
    notes.append(f"in-process restart: --inprocess-max-iterations{given} bounds the incarnations"
                 f"{'' if given else f' ({DEFAULT_MAX_INCARNATIONS} by default here)'}, as nvidia-resiliency-ext's "
                 "RetryController(max_iterations) does; Megatron-LM's inprocess_restart.py does not hand the flag on "
                 "(its RetryController gets min_world_size only), so there a fault met at every restart restarts "
                 "without end")
    if training.faults.inprocess_granularity == "node":
        notes.append("in-process restart: --inprocess-granularity node takes out every rank of a host with CUDA "
                     "devices in Megatron-LM (a layer of torch.cuda.device_count() ranks per host); here each rank "
                     "is restarted or replaced alone, as with --inprocess-granularity rank")
    return notes


def run_restarting(config: PretrainConfig, run: RunOnGrid, program: str,
                   fault_tolerance: Optional[FaultTolerance]) -> int:
    """`run` in this process until the job is done, re-run after each fault; the last run's exit status."""
    training, launch = config.training, read_launch_environment()
    store = RestartStore(launch.master_addr, launch.master_port, launch.rank, launch.world_size,
                         training.faults.inprocess_heartbeat_interval, training.faults.inprocess_barrier_timeout)
    try:
        assignment = first_assignment(launch.world_size, training.faults.inprocess_active_world_size or launch.world_size)
        incarnation, bound = 0, incarnation_bound(training)
        while True:
            _set_incarnation(assignment, launch.rank, incarnation, bound)
            rank = assignment.rank_of(launch.rank)
            role = "waits as a spare" if rank is None else f"trains as rank {rank} of {assignment.active_world_size}"
            print(f"> in-process incarnation {incarnation}: launch rank {launch.rank} (pid {os.getpid()}) {role}",
                  flush=True)
            if rank is None:
                # a hot spare: alive, beating, in no process group
                trainers = [trainer for trainer, active in assignment.active_ranks.items() if active is not None]
                ended = store.wait_for_end(incarnation, trainers, training.faults.inprocess_heartbeat_timeout)
                exit_code = 0
            else:
                ended, exit_code = _train_once(config, run, store, incarnation, rank, fault_tolerance)
            if ended == "done":
                store.finish(len(assignment.active_ranks), training.faults.inprocess_completion_timeout)
                return exit_code
            alive = sorted(assignment.active_ranks)
            gone = store.rendezvous(incarnation + 1, alive, training.faults.inprocess_heartbeat_timeout,
                                    training.faults.inprocess_barrier_timeout)
            if launch.rank in gone:  # taken for dead by the others (nvidia-resiliency-ext's RankDiscarded)
                raise RestartsExhausted(f"launch rank {launch.rank} was taken for gone at in-process restart "
                                        f"{incarnation + 1} (its heartbeat older than --inprocess-heartbeat-timeout)")
            speaks = launch.rank == min(launch for launch in alive if launch not in gone)
            try:
                following = reassign(assignment, gone)
            except TooFewProcesses as error:  # the cause first: which rank stopped or failed, and how
                raise RestartsExhausted(f"in-process restart {incarnation + 1}: "
                                        f"{restart_cause(store, incarnation, assignment, gone)}; {error}",
                                        speaks) from None
            cause = restart_line(store, incarnation, assignment, following, gone, config.checkpoint.load)
            # Megatron-LM passes RetryController only min_world_size, so there the flag bounds nothing; here it bounds
            # the incarnations, as its help says.
            if incarnation + 1 >= bound:
                raise RestartsExhausted(f"{cause}: no restart left (--inprocess-max-iterations {bound}"
                                        f"{'' if training.faults.inprocess_max_iterations else ', the default here'})",
                                        speaks)
            if following.rank_of(launch.rank) == 0:
                print(f"{program}: {cause}", file=sys.stderr, flush=True)
            assignment, incarnation = following, incarnation + 1
    finally:
        store.close()


def _train_once(config: PretrainConfig, run: RunOnGrid, store: RestartStore, incarnation: int, rank: int,
                fault_tolerance: Optional[FaultTolerance]) -> tuple[str, int]:
    """One incarnation on this trainer: ("done", status), or ("fault", 0) after an exception here or a peer's."""
    state: Optional[ParallelState] = None
    try:
        state = initialize_grid(config.training.device, config.parallel,
                                config.training.faults.distributed_timeout_minutes,
                                config.zero.distributed_optimizer_instances, store=store.group_store(incarnation))
        exit_code = run(config, state, fault_tolerance)
        if fault_tolerance is not None:
            fault_tolerance.close(finished=True)
        store.record_done(incarnation)
        return "done", exit_code
    except NOT_RESTARTED:
        raise
    except Exception as error:  # recorded before the abort: the first record in time is the cause
        store.record_failure(incarnation, rank, f"{type(error).__name__}: {one_line(error)}",
                             state.comm.iteration if state is not None else None)
        # every peer blocked in a collective with this rank fails at once
        shut_down_connections(store.ports())
        return "fault", 0
    finally:
        if state is not None:
            destroy(state)
            state = None
            gc.collect()


def restart_cause(store: RestartStore, incarnation: int, before: Assignment, gone: list[int]) -> str:
    """Which rank is gone or failed, with what, at which iteration."""
    causes = []
    for launch in gone:
        who = f"rank {before.rank_of(launch)}" if before.rank_of(launch) is not None else "a spare"
        causes.append(f"{who} (launch rank {launch}) is gone: no heartbeat within --inprocess-heartbeat-timeout")
    failures = store.failures(incarnation, sorted(before.active_ranks))
    if failures and not gone:
        first = failures[0]
        at = f" at iteration {first.iteration}" if first.iteration is not None else " before training"
        causes.append(f"rank {first.rank} failed{at} with {first.error}")
    return "; ".join(causes) or "a trainer failed"


def restart_line(store: RestartStore, incarnation: int, before: Assignment, after: Assignment, gone: list[int],
                 load: Optional[str]) -> str:
    spares = [f"launch rank {launch} (a spare) becomes rank {after.rank_of(launch)}" for launch in after.active_ranks
              if before.rank_of(launch) is None and after.rank_of(launch) is not None]
    return (f"in-process restart {incarnation + 1}: {restart_cause(store, incarnation, before, gone)}"
            f"{'; ' + ', '.join(spares) if spares else ''}; every process stays, resuming from "
            f"{_latest_checkpoint(load)}")


def _latest_checkpoint(load: Optional[str]) -> str:
    tracker = Path(load) / TRACKER_FILE if load else None
    if tracker is None or not tracker.exists():
        return "iteration 0 (no checkpoint in --load)"
    return f"the checkpoint at iteration {tracker.read_text().strip()} in --load"


def _set_incarnation(assignment: Assignment, launch_rank: int, incarnation: int, max_iterations: int) -> None:
    """This incarnation's RANK and WORLD_SIZE, as nvidia-resiliency-ext sets them, and its restart count."""
    rank = assignment.rank_of(launch_rank)
    if rank is not None:
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(assignment.active_world_size)
    os.environ[INPROCESS_RESTART] = str(incarnation)
    os.environ[INPROCESS_MAX_ITERATIONS] = str(max_iterations)
