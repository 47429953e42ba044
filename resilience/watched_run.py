"""One rank's run inside its process group, watched: the heartbeats that name a dead or silent peer
(rendezvous/liveness.py), the flight recorder that says where each group's ranks stood (rendezvous/flight_recorder.py),
the agreement on who prints an error met by some ranks only (rendezvous/failure_report.py), and the fault-tolerance
sections (resilience/fault_tolerance.py). pretrain_gpt.py makes the process group and hands it here with the run to
do; whatever happens, the group is destroyed and the peers are told why this rank left.
"""

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
# The run a runner watches or restarts, to its exit status: the runners sit below training/, which they run.
RunOnGrid = Callable[[PretrainConfig, ParallelState, Optional[FaultTolerance]], int]


def run_watched(config: PretrainConfig, state: ParallelState, run: RunOnGrid, program: str,
                expected_errors: tuple[type[BaseException], ...], flight: FlightRecorderSettings,
                fault_tolerance: Optional[FaultTolerance]) -> int:
    """`run` on this rank's initialized grid `state`; its exit status (0, or 16 and 17 when the rerun
    state machine ended the job, resilience/rerun_state.py). An error every peer is alive for keeps its own report (its
    traceback, or its line by the agreement), a collective failed because a peer is gone ends in the one line
    naming it (PeerLostError); the group is destroyed at the end either way."""
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
        if fault_tolerance is not None:  # every rank is here: the last learning of --calc-ft-timeouts
            fault_tolerance.close(finished=True)
        return exit_code
    except expected_errors + (InjectedFault,) as error:
        # Not a lost peer: an error met by every rank alike (the ranks agree on their checks), or by this rank
        # alone; the store decides who prints it (rendezvous/failure_report.py).
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
                print(f"{program}: " + recorder.report_failed_collective(
                    state.comm.iteration, liveness.board.store, liveness.board.prefix), file=sys.stderr, flush=True)
            elif recorder is not None:
                recorder.dump_on_error(state.comm.iteration)
            raise  # every peer is alive: this rank's own failure keeps its traceback
        lost = True
        if loss.failed is not None:  # a peer's collective work failed: it prints, this rank takes its status
            raise PeerLostError(loss.describe(state.rank, state.comm.where()), speaks=False,
                                status=loss.failed_status) from None
        raise PeerLostError(peer_lost_line(loss, state, recorder, liveness)) from None
    finally:
        state.comm.publish_failure = None
        if recorder is not None:
            recorder.stop()
        # Marked as left (and an error of this rank's own in the verdict) before the group goes, so
        # that the peers blocked on this rank read why; then the store's host waits for them to leave.
        if liveness is not None:
            liveness.stop(after_loss=lost, own_error=own_error)
        destroy(state)
        if liveness is not None:
            liveness.linger()


def watch_peers(state: ParallelState, heartbeat_timeout_seconds: float, program: str,
                recorder: Optional[FlightRecorder] = None) -> Optional[Liveness]:
    """This rank's heartbeat (rendezvous/liveness.py) on a multi-rank run; a peer found dead or stalled
    while the main thread may be blocked in a collective ends the process with the one line."""
    if state.world_size == 1:
        return None
    launch = read_launch_environment()
    started: list[Liveness] = []  # on_lost runs only once the watch has started

    def on_lost(loss: PeerLoss) -> None:
        if loss.failed is not None:  # a peer's collective work failed: it prints its line, this rank its status
            exit_at_once(program, None, loss.failed_status)
        exit_at_once(program, PeerLostError(peer_lost_line(loss, state, recorder, started[0] if started else None)))

    started.append(start_liveness(state.rank, state.world_size, launch.master_addr, launch.master_port,
                                  stall_timeout_s=heartbeat_timeout_seconds, on_lost=on_lost))
    return started[0]


def publish_failure(liveness: Liveness, expected_errors: tuple[type[BaseException], ...],
                    error: BaseException) -> None:
    """An error of collective work (parallel/comm.py), with the status run_tool will end this rank with, for the
    peers to end with too."""
    status = EXIT_INJECTED_FAULT if isinstance(error, InjectedFault) else \
        EXIT_BAD_INPUT if isinstance(error, expected_errors) else EXIT_UNCAUGHT
    liveness.publish_failure(one_line(error), status)


def peer_lost_line(loss: PeerLoss, state: ParallelState, recorder: Optional[FlightRecorder],
                   liveness: Optional[Liveness]) -> str:
    """The lost peer's line; with --flight-recorder-dump-path, every live rank dumps and the line goes on with
    where each group's ranks stand (rendezvous/flight_recorder.py), the live ranks' records shared through the
    rendezvous store unless it is the store that went."""
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
