"""Fault handling's settings: the collectives' timeout, the heartbeat watch, the flight recorder, fault tolerance,
in-process restarts and the rerun machine; a section of TrainingConfig, with its refusal checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from base.errors import ConfigError
from base.options import Const, flag_of_setting, option
from base.waits import LONGEST_WAIT_TEXT, is_wait

# Below a few heartbeats (one a second), a rank busy on a loaded machine would be taken for a hung one.
MIN_HEARTBEAT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class FaultHandlingSettings:
    SETTING_PREFIX: ClassVar[str] = ""

    # A dead or hung rank ends the job after this.
    distributed_timeout_minutes: float = option(
        10.0, group="checkpoint",
        help="how long a collective waits for a peer before the job fails (a dead rank)")
    # llm-jp's Megatron-LM fork: parse_args (megatron/training/arguments.py) copies OpenMPI's
    # OMPI_COMM_WORLD_RANK, _LOCAL_RANK and _SIZE into RANK, LOCAL_RANK and WORLD_SIZE (parallel/launch_environment.py).
    use_mpi: bool = option(
        False, action="store_true", group="checkpoint",
        help="take this process's rank, local rank and world size from OpenMPI's mpirun (OMPI_COMM_WORLD_RANK, "
             "_LOCAL_RANK, _SIZE; MASTER_ADDR and MASTER_PORT as the launch script exports them), as llm-jp's "
             "Megatron-LM fork does")
    # The watch: rendezvous/liveness.py.
    heartbeat_timeout_seconds: float = option(
        120.0, group="checkpoint",
        help="stop, naming the rank, when a peer's heartbeat stands still this long (a stopped or hung rank), "
             "instead of waiting for --distributed-timeout-minutes; 0: no watch")
    # A hang traced to its collective (rendezvous/flight_recorder.py): Megatron-LM's --flight-recorder-* flags, which
    # export PyTorch's Flight Recorder variables (megatron/training/initialize.py, _initialize_distributed); the
    # same ring is kept here for every backend, gloo included, and dumped when the heartbeat watch or a failed
    # collective ends the run. Defaults as Megatron's.
    flight_recorder_dump_path: Optional[str] = option(
        None, group="checkpoint", metavar="PATH",
        help="keep a ring of each rank's last collectives and, when a rank hangs or dies, write every live rank's "
             "ring and thread stacks here (a directory: <dir>/_dump_<rank>.json; else a file prefix) and name in "
             "one line where each group's ranks disagree; python -m rendezvous.flight_recorder PATH re-reads them")
    flight_recorder_trace_buffer_size: int = option(
        2000, group="checkpoint", help="collectives kept in each rank's ring (TORCH_NCCL_TRACE_BUFFER_SIZE)")
    flight_recorder_dump_on_timeout: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-flight-recorder-dump-on-timeout", "--disable-flight-recorder-dump-on-timeout"), False),),
        help="write the dumps when a hang or a lost rank is found (TORCH_NCCL_DUMP_ON_TIMEOUT)")
    flight_recorder_include_stack_trace: bool = option(
        False, group="checkpoint", action="store_true",
        help="TORCH_INCLUDE_STACK_TRACE for NCCL's own recorder; this ring always names each collective's call "
             "site, and a dump always holds every thread's stack")
    flight_recorder_include_only_active: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-flight-recorder-include-only-active", "--disable-flight-recorder-include-only-active"),
                      False),),
        help="a dump lists only the collectives not completed (each group's last completed one is always named)")
    flight_recorder_extra_dump_on_exec: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-flight-recorder-extra-dump-on-exec", "--disable-flight-recorder-extra-dump-on-exec"),
                      False),),
        help="also dump when a rank fails on an error of its own (TORCH_NCCL_EXTRA_DUMP_ON_EXEC)")
    # Megatron-LM's fault tolerance flags (megatron/training/ft_integration.py): resilience/fault_tolerance.py.
    enable_ft_package: bool = option(
        False, action="store_true", group="checkpoint",
        help="fault tolerance sections (setup, step, checkpointing) with timeouts from the launcher (scripts/launch.py "
             "--ft-rank-section-timeouts) or learned (--calc-ft-timeouts): a rank past one is ended by its monitor and "
             "the launcher's --max-restarts restarts the job from the latest checkpoint; needs --save")
    calc_ft_timeouts: bool = option(
        False, action="store_true", group="checkpoint",
        help="with --enable-ft-package: learn the section timeouts from this run's times (5 x the longest, after "
             "each save and at the end), kept in --save's ft_state.json for the next start")
    ft_num_warmup_iters: int = option(
        5, group="checkpoint",
        help="with --enable-ft-package: training iterations of each start outside the step section and the "
             "out-of-section watch (the first ones are slow)")
    # Megatron-LM's in-process restart (megatron/training/inprocess_restart.py, _add_inprocess_restart_args in
    # arguments.py; nvidia-resiliency-ext's inprocess.Wrapper): resilience/inprocess_restart.py. The flags of what is
    # not built here (the progress timeouts, the monitor process) stay accepted with no effect
    # (arguments/megatron/flag_classes.py).
    inprocess_restart: bool = option(
        False, action="store_true", group="checkpoint",
        help="on an error or a dead rank the processes stay: each aborts its process groups, the survivors agree on "
             "a new incarnation (a spare in a dead rank's place), re-form the groups and resume from the latest "
             "checkpoint (--load = --save) in the same process")
    inprocess_max_iterations: Optional[int] = option(
        None, group="checkpoint",
        help="with --inprocess-restart: the most incarnations (the first run and its restarts); 10 when not given "
             "(Megatron-LM hands nvidia-resiliency-ext no bound, so a fault met at every restart restarts for ever)")
    inprocess_heartbeat_interval: float = option(
        30.0, group="checkpoint", help="with --inprocess-restart: seconds between a process's heartbeats")
    inprocess_heartbeat_timeout: float = option(
        60.0, group="checkpoint",
        help="with --inprocess-restart: a process whose heartbeat stood still this long is taken as dead at a restart")
    inprocess_barrier_timeout: float = option(
        120.0, group="checkpoint",
        help="with --inprocess-restart: the most seconds the survivors wait for each other at a restart")
    inprocess_completion_timeout: float = option(
        120.0, group="checkpoint",
        help="with --inprocess-restart: the most seconds the launch rank 0, which hosts the restart store, waits at "
             "the end for every process to finish")
    inprocess_active_world_size: Optional[int] = option(
        None, group="checkpoint",
        help="with --inprocess-restart: the processes that train (the first N launch ranks); the others wait as hot "
             "spares and take a dead rank's place (Megatron's default: every process, WORLD_SIZE)")
    inprocess_granularity: str = option(
        "node", group="checkpoint", choices=("node", "rank"),
        help="with --inprocess-restart: what a fault takes out (Megatron's default node: every rank of the host, "
             "which on a host without CUDA devices is each rank alone; rank: the rank alone)")
    # Megatron-Core's rerun state machine (megatron/core/rerun_state_machine.py; the flags are Megatron-LM's
    # _add_rerun_machine_args and --no-check-for-nan-in-loss-and-grad): resilience/rerun_state.py. Megatron's default
    # mode, validate_results, is a Megatron launch's (the model set by flags: arguments/megatron/defaults.py); a
    # preset's is disabled, where a NaN loss stops the run after the step (its line names validate_results).
    rerun_mode: str = option(
        "disabled", group="checkpoint", choices=("disabled", "validate_results", "report_stats"),
        help="validate_results: a NaN/Inf loss (or a spike, --check-for-spiky-loss) re-runs the iteration on the same "
             "data and RNG state; not reproduced: exit 17 (a spike: logged and on); reproduced: checkpoint (with "
             "--save) and exit 16, and the job resumed from it re-runs it again to decide (Megatron's default, a "
             "Megatron launch's; a preset's is disabled). report_stats: every iteration runs twice and how much the "
             "validated losses differ is printed every 2 iterations")
    check_for_nan_in_loss_and_grad: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-check-for-nan-in-loss-and-grad",), False),),
        help="with --rerun-mode validate_results: validate each micro-batch's loss against NaN and Inf")
    check_for_spiky_loss: bool = option(
        False, group="checkpoint", action="store_true",
        help="with --rerun-mode validate_results: a micro-batch loss 10x the largest of the first 100 re-runs the "
             "iteration (not fatal: training goes on)")
    error_injection_rate: int = option(
        0, group="checkpoint",
        help="with --rerun-mode validate_results: reject one validated loss in this many (per rank), to test the "
             "re-run; 0 or less injects nothing (Megatron-Core injects only where the rate is > 0)")
    error_injection_type: str = option(
        "transient_error", group="checkpoint", choices=("correct_result", "transient_error", "persistent_error"),
        help="what an injected rejection acts as: transient_error (the re-run differs: on), persistent_error and "
             "correct_result (the re-run reproduces it: checkpoint and exit 16)")
    result_rejected_tracker_filename: Optional[str] = option(
        None, group="checkpoint", metavar="FILE",
        help="append one line per rejected result and re-run verdict (Megatron's format) to FILE")

    def validate(self) -> None:
        """The timeouts, the flight recorder, in-process restarts and fault tolerance's warm-up."""
        if not self.distributed_timeout_minutes > 0:
            raise ConfigError(f"--distributed-timeout-minutes must be positive, got {self.distributed_timeout_minutes}",
                              flags=("--distributed-timeout-minutes",))
        if not (self.heartbeat_timeout_seconds == 0 or MIN_HEARTBEAT_TIMEOUT_S <= self.heartbeat_timeout_seconds
                and is_wait(self.heartbeat_timeout_seconds)):
            raise ConfigError(f"--heartbeat-timeout-seconds must be 0 (no watch) or a number of seconds from "
                              f"{MIN_HEARTBEAT_TIMEOUT_S:g} (a few heartbeats, one a second) up to {LONGEST_WAIT_TEXT}, "
                              f"got {self.heartbeat_timeout_seconds}", flags=("--heartbeat-timeout-seconds",))
        if self.flight_recorder_trace_buffer_size < 0:
            raise ConfigError(f"--flight-recorder-trace-buffer-size must be 0 (no ring) or more, got "
                              f"{self.flight_recorder_trace_buffer_size}", flags=("--flight-recorder-trace-buffer-size",))
        check_inprocess_settings(self)
        if self.ft_num_warmup_iters < 0:
            raise ConfigError(f"--ft-num-warmup-iters must be 0 or more, got {self.ft_num_warmup_iters}",
                              flags=("--ft-num-warmup-iters",))


def check_inprocess_settings(faults: FaultHandlingSettings) -> None:
    """The --inprocess-* values Megatron-LM would hand nvidia-resiliency-ext's Wrapper, which rejects a
    non-positive interval or timeout and a restart bound below one incarnation."""
    for name in ("inprocess_heartbeat_interval", "inprocess_heartbeat_timeout", "inprocess_barrier_timeout",
                 "inprocess_completion_timeout"):
        value = getattr(faults, name)
        if not is_wait(value, zero_allowed=False):
            raise ConfigError(f"{_flag(name)} must be a number of seconds above 0 up to {LONGEST_WAIT_TEXT}, got "
                              f"{value}", flags=(_flag(name),))
    if faults.inprocess_heartbeat_timeout <= faults.inprocess_heartbeat_interval:
        raise ConfigError(f"--inprocess-heartbeat-timeout ({faults.inprocess_heartbeat_timeout:g} s) must be longer "
                          f"than --inprocess-heartbeat-interval ({faults.inprocess_heartbeat_interval:g} s): a live "
                          "process would be taken as dead between two beats",
                          flags=("--inprocess-heartbeat-timeout", "--inprocess-heartbeat-interval"))
    for name in ("inprocess_max_iterations", "inprocess_active_world_size"):
        value = getattr(faults, name)
        if value is not None and value < 1:
            raise ConfigError(f"{_flag(name)} must be at least 1, got {value}", flags=(_flag(name),))


def _flag(name: str) -> str:
    return flag_of_setting(FaultHandlingSettings, name)
