"""One rank's run inside its process group, watched: heartbeats, the flight recorder, failure agreement and
fault-tolerance sections. Whatever happens, the group is destroyed and the peers are told why this rank left."""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable, Optional

from arguments.config import PretrainConfig
from arguments.fault_handling import FaultHandlingSettings
from base.errors import EXIT_BAD_INPUT, EXIT_INJECTED_FAULT, InjectedFault, PeerLostError, exit_at_once, one_line
from parallel.launch_environment import read_launch_environment
from parallel.state import ParallelState, destroy
from rendezvous.failure_report import agree_on_failure
from rendezvous.flight_recorder import FlightRecorder, FlightRecorderSettings, start_flight_recorder
from rendezvous.liveness import Liveness, PeerLoss, start_liveness
from resilience.fault_tolerance import FaultTolerance

EXIT_UNCAUGHT = 1  # Python's status for an exception that keeps its traceback
# The run a runner watches or restarts, to its exit status.
RunOnGrid = Callable[[PretrainConfig, ParallelState, Optional[FaultTolerance]], int]


def run_watched(config: PretrainConfig, state: ParallelState, run: RunOnGrid, program: str,
                expected_errors: tuple[type[BaseException], ...], flight: FlightRecorderSettings,
                fault_tolerance: Optional[FaultTolerance]) -> int:
    """`run` on this rank's grid; its exit status (0, 16 or 17). An error every peer is alive for keeps its own report;
    a collective failed because a peer is gone ends in one line naming it."""
    liveness: Optional[Liveness] = None
    recorder: Optional[FlightRecorder] = None
    lost = own_error = False
    try:
        if flight.on:
            recorder = start_flight_recorder(flight, state.comm, state.rank, state.world_size,
                                             config.training.faults.heartbeat_timeout_seconds)
        liveness = watch_peers(state, config.training.faults.heartbeat_timeout_seconds, program, recorder)
        if liveness is not None:
            state.comm.publish_failure = partial(publish_failure, liveness, expected_errors)
        exit_code = run(config, state, fault_tolerance)
        if fault_tolerance is not None:
            fault_tolerance.close(finished=True)
        return exit_code
    except expected_errors + (InjectedFault,) as error:
        # An error every rank met, or this rank alone: the store decides who prints it.
        if liveness is not None and not isinstance(error, KeyboardInterrupt):
            error.reporter = agree_on_failure(liveness.board.store, liveness.board.prefix, state.rank,
                                              state.world_size, one_line(error), state.place())
        raise
    except Exception:
        # Anything else may be a collective that failed because a peer is gone: the heartbeats say.
        loss = liveness.explain_failure() if liveness is not None else None
        if loss is None:
            own_error = True
            if recorder is not None and liveness is not None and recorder.in_collective():
                # a timeout with every peer alive: where each rank stands, above the traceback
                print(f"{program}: " + recorder.report_failed_collective(
                    state.comm.iteration, liveness.board.store, liveness.board.prefix), file=sys.stderr, flush=True)
            elif recorder is not None:
                recorder.dump_on_error(state.comm.iteration)
            raise  # this rank's own failure keeps its traceback
        lost = True
        if loss.failed is not None:  # a peer's collective work failed: it prints, this rank takes its status
            raise PeerLostError(loss.describe(state.rank, state.comm.where()), speaks=False,
                                status=loss.failed_status) from None
        raise PeerLostError(peer_lost_line(loss, state, recorder, liveness)) from None
    finally:
        state.comm.publish_failure = None
        if recorder is not None:
            recorder.stop()
        # Marked as left before the group goes, so peers blocked on this rank read why.
        if liveness is not None:
            liveness.stop(after_loss=lost, own_error=own_error)
        destroy(state)
        if liveness is not None:
            liveness.linger()


def watch_peers(state: ParallelState, heartbeat_timeout_seconds: float, program: str,
                recorder: Optional[FlightRecorder] = None) -> Optional[Liveness]:
    """This rank's heartbeat on a multi-rank run; a peer found lost while the main thread may be blocked ends the
    process with one line."""
    if state.world_size == 1:
        return None
    launch = read_launch_environment()
    started: list[Liveness] = []

    def on_lost(loss: PeerLoss) -> None:
        if loss.failed is not None:  # a peer's collective work failed: it prints, this rank takes its status
            exit_at_once(program, None, loss.failed_status)
        exit_at_once(program, PeerLostError(peer_lost_line(loss, state, recorder, started[0] if started else None)))

    started.append(start_liveness(state.rank, state.world_size, launch.master_addr, launch.master_port,
                                  stall_timeout_s=heartbeat_timeout_seconds, on_lost=on_lost))
    return started[0]


def publish_failure(liveness: Liveness, expected_errors: tuple[type[BaseException], ...],
                    error: BaseException) -> None:
    """Publish an error of collective work, with the status run_tool will end with, for the peers to take."""
    status = EXIT_INJECTED_FAULT if isinstance(error, InjectedFault) else \
        EXIT_BAD_INPUT if isinstance(error, expected_errors) else EXIT_UNCAUGHT
    liveness.publish_failure(one_line(error), status)


def peer_lost_line(loss: PeerLoss, state: ParallelState, recorder: Optional[FlightRecorder],
                   liveness: Optional[Liveness]) -> str:
    """The lost peer's line; with --flight-recorder-dump-path, followed by where each group's ranks stand."""
    line = loss.describe(state.rank, state.comm.where())
    if recorder is None:
        return line
    shares = liveness is not None and loss.store_host is None and loss.paused_for_s is None
    reason = "this rank did not run (stopped)" if loss.paused_for_s is not None else line
    analysis = recorder.report(reason, state.comm.iteration, loss.silent, loss.exited,
                               liveness.board.store if shares else None, liveness.board.prefix if shares else "")
    return f"{line}; {analysis}" if analysis else line


def flight_recorder_settings(faults: FaultHandlingSettings) -> FlightRecorderSettings:
    return FlightRecorderSettings(
        dump_path=faults.flight_recorder_dump_path, trace_buffer_size=faults.flight_recorder_trace_buffer_size,
        dump_on_timeout=faults.flight_recorder_dump_on_timeout,
        include_stack_trace=faults.flight_recorder_include_stack_trace,
        include_only_active=faults.flight_recorder_include_only_active,
        extra_dump_on_exec=faults.flight_recorder_extra_dump_on_exec)
