#!/usr/bin/env python
"""torchrun, ending with the job's own exit status and without torchrun's traceback.

    python scripts/launch.py --standalone --nproc_per_node 8 pretrain_gpt.py --config gpt2-124m ...

It takes torchrun's arguments. The exit status is the first failing rank's (2 a bad input, 130 Ctrl-C, 0 after a
signal-triggered save), a failure one line; SIGTERM, SIGINT and SIGUSR1 reach every rank while the launcher keeps
the store; ranks get --shutdown-timeout 300 and ft_launcher's timeouts."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a script, the repo's packages are not on the path

from base.errors import EXIT_STATUS_DIR_VARIABLE  # noqa: E402

DEFAULT_SHUTDOWN_TIMEOUT_S = 300
# Each means "save and exit" to a rank run with --exit-signal-handler (training/exit_conditions.py).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def torchrun_signals(listed: str) -> str:
    """torchrun's --signals_to_handle less the launcher's own FORWARDED_SIGNALS, which torchrun must not
    take over (it registers its handler for each it lists when it starts the ranks)."""
    own = {signum.name for signum in FORWARDED_SIGNALS}
    return ",".join(name.strip() for name in listed.split(",") if name.strip() and name.strip() not in own)


def children() -> list[int]:
    """The pids of this process's children (torchrun's agent starts each rank as one, in a session of its
    own); none where there is no /proc."""
    pids = []
    for listing in Path("/proc/self/task").glob("*/children"):
        try:
            pids += [int(pid) for pid in listing.read_text().split()]
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return pids


def send_to_ranks(signum: int) -> None:
    """`signum` to each rank's process group, as torchrun's agent sends its own (SubprocessHandler.close:
    os.killpg), so that the rank's data-loader workers, which leave that group (data/sampler.py), are spared."""
    for pid in children():
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue  # it exited meanwhile


class SignalForwarder:
    """The launcher's handler of FORWARDED_SIGNALS. The first raises what torchrun's own handler raises
    (torch/distributed/elastic/multiprocessing/api.py, `_terminate_process_handler`): the agent catches it
    (agent/server/api.py, SimpleElasticAgent.run -> `_shutdown(e.sigval, timeout=shutdown_timeout)` ->
    SubprocessContext._close), sends the signal to every rank, waits for them up to the shutdown timeout,
    kills the rest, and re-raises; launch_agent then leaves the rendezvous open, so the store lives until
    this process exits, after its ranks. A later one never raises, so the agent's wait is not cut short
    (torchrun's handler would raise again, out of the wait, and torchrun would exit with its ranks still
    saving). A later SIGINT is a second Ctrl-C and goes to the ranks, which take it as one (stop at once,
    no save). A later SIGTERM or SIGUSR1 (a scheduler repeating itself) goes nowhere: every rank has
    had one, and a repeat could only reach a rank that has saved and put back the default action
    (training/exit_conditions.py, close), which would kill it before it records its status. Once
    torchrun has returned (`agent_done`) nothing raises, and main() ends by ignoring these signals, so
    one that comes after the ranks exited does not kill the launcher (SIGUSR1's default action) before
    it exits with the job's status."""

    def __init__(self) -> None:
        self.first: signal.Signals | None = None
        self.agent_done = False
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self)

    def __call__(self, signum: int, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if self.first is None and not self.agent_done:
            self.first = signal.Signals(signum)
            raise SignalException(f"launch.py (pid {os.getpid()}) got {self.first.name}", sigval=self.first)
        if signum == signal.SIGINT:
            send_to_ranks(signum)


def recorded_statuses(status_dir: Path) -> dict[int, int]:
    """rank -> the status its error boundary recorded (base/errors.py); a rank killed or crashed
    before its boundary recorded nothing. The directory is this launcher's own, so it holds exactly
    the statuses of the ranks it started."""
    statuses = {}
    for path in status_dir.glob("rank*"):
        try:
            statuses[int(path.name[len("rank"):])] = int(path.read_text())
        except ValueError:
            continue  # half-written by a rank killed mid-write: as good as nothing
    return statuses


def first_failure(status_dir: Path) -> str | None:
    """The summary of the rank that failed first on an error of its own (base/errors.py records its time
    and line), or None when none did."""
    records = []
    for path in status_dir.glob("failure*"):
        try:
            record = json.loads(path.read_text())
            records.append((float(record["time"]), int(path.name[len("failure"):]), str(record["line"])))
        except (ValueError, KeyError, TypeError):
            continue  # half-written by a rank killed mid-write
    if not records:
        return None
    _, rank, line = min(records)
    return f"launch.py: rank {rank} failed first: {line}"


def job_status(statuses: dict[int, int], ranks_started: int, fallback: int) -> int:
    """The first non-zero status this node's ranks recorded (in rank order), 0 if all recorded 0,
    and `fallback` when one recorded nothing (it was killed, or crashed with a traceback)."""
    if len(statuses) != ranks_started:
        return fallback
    return next((statuses[rank] for rank in sorted(statuses) if statuses[rank] != 0), 0)


def failure_status(failure) -> int:
    """torchrun's root-cause rank's exit code as a shell would report it."""
    _, process = failure.get_first_failure()
    return 128 - process.exitcode if process.exitcode < 0 else process.exitcode or 1


def failure_line(failure, host: str) -> str:
    """torchrun's report of its root-cause rank (the first to fail) in one line: who, where, how."""
    rank, process = failure.get_first_failure()
    return death_line(rank, process.local_rank, process.exitcode, host)


def death_line(rank: int | None, local_rank: int, exitcode: int, host: str) -> str:
    """One rank's end in one line: which rank, on which host, the signal or exit status."""
    if exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
    else:
        how = f"exited with status {exitcode} (see its output above)"
    who = f"rank {rank} (local rank {local_rank} on host {host})" if rank is not None else \
        f"local rank {local_rank} on host {host}"
    return f"launch.py: error: {who} died: {how}; torchrun stopped the other ranks"


def say_failure(death: str, status_dir: Path) -> None:
    """The death line where no rank said a word (it was killed or crashed), else the first rank's own error."""
    if not any(recorded_statuses(status_dir).values()):
        print(death, file=sys.stderr, flush=True)
    elif (summary := first_failure(status_dir)) is not None:
        print(summary, file=sys.stderr, flush=True)


class RestartReporter(logging.Handler):
    """Under --max-restarts torchrun's agent restarts a failed job itself, without a word. Before each restart this
    says which rank died first and how, the first error line a rank recorded (if one did), then "restarting, 1 of
    2". It reads the two records torch logs: its process context's first failure, its agent's "will restart"."""

    def __init__(self, status_dir: Path, host: str, node_rank: int | None, ranks_per_node: int) -> None:
        super().__init__(logging.INFO)
        self.status_dir, self.host, self.node_rank, self.ranks_per_node = status_dir, host, node_rank, ranks_per_node
        self.failure: tuple[int, int] | None = None  # the first failed process's (exit code, local rank)

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("failed (exitcode") and len(record.args) >= 2:
            self.failure = (int(record.args[0]), int(record.args[1]))
        elif "will restart worker group" in str(record.msg) and len(record.args) == 4 and self.failure is not None:
            exitcode, local_rank = self.failure
            rank = None if self.node_rank is None else self.node_rank * self.ranks_per_node + local_rank
            print(death_line(rank, local_rank, exitcode, self.host), file=sys.stderr, flush=True)
            if (summary := first_failure(self.status_dir)) is not None:  # a rank's own last error line
                print(summary, file=sys.stderr, flush=True)
            remaining, most = int(record.args[2]), int(record.args[3])
            print(f"launch.py: restarting, {most - remaining + 1} of {most}", file=sys.stderr, flush=True)
            for path in self.status_dir.iterdir():  # said: the restarted ranks record their own
                path.unlink(missing_ok=True)
            self.failure = None

    def listen(self) -> None:
        """Take the two loggers' records (torch's elastic loggers have no handler of their own)."""
        for name, level in (("torch.distributed.elastic.multiprocessing.api", logging.ERROR),
                            ("torch.distributed.elastic.agent.server.api", logging.INFO)):
            logger = logging.getLogger(name)
            logger.setLevel(level)
            logger.handlers, logger.propagate = [self], False


# ft_launcher's (nvidia-resiliency-ext fault_tolerance/launcher.py) section timeouts, for --enable-ft-package
FT_SECTION_TIMEOUTS = ("--ft-rank-section-timeouts", "--ft-rank_section_timeouts")
FT_OUT_OF_SECTION_TIMEOUT = ("--ft-rank-out-of-section-timeout", "--ft-rank_out_of_section_timeout")


def take_ft_timeouts(argv: list[str]) -> tuple[list[str], dict]:
    """ft_launcher's `--ft-rank-section-timeouts setup:600,step:180,checkpointing:420` and
    `--ft-rank-out-of-section-timeout 300` (either spelling, `=` or a separate value), given before the training
    script: (the rest of the arguments for torchrun, the timeouts for resilience/fault_tolerance.py)."""
    from resilience.fault_tolerance import parse_section_timeouts, parse_timeout

    rest, timeouts, index = [], {}, 0
    script_at = next((i for i, token in enumerate(argv) if token.endswith(".py")), len(argv))
    while index < len(argv):
        token = argv[index]
        name, has_value, value = token.partition("=")
        if index < script_at and name in FT_SECTION_TIMEOUTS + FT_OUT_OF_SECTION_TIMEOUT:
            if not has_value:
                index += 1
                value = argv[index] if index < len(argv) else ""
            try:
                timeouts.update(parse_section_timeouts(value) if name in FT_SECTION_TIMEOUTS
                                else {"out_of_section": parse_timeout(value)})
            except ValueError as error:
                print(f"launch.py: error: {name} {value!r}: {error}", file=sys.stderr, flush=True)
                sys.exit(2)
        else:
            rest.append(token)
        index += 1
    return rest, timeouts


def main(argv=None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from resilience.fault_tolerance import FT_TIMEOUTS_VARIABLE

    argv, ft_timeouts = take_ft_timeouts(list(sys.argv[1:] if argv is None else argv))
    if ft_timeouts:
        os.environ[FT_TIMEOUTS_VARIABLE] = json.dumps(ft_timeouts)
    args = parse_args(argv)
    if args.shutdown_timeout is None and "TORCHELASTIC_SHUTDOWN_TIMEOUT" not in os.environ:
        args.shutdown_timeout = DEFAULT_SHUTDOWN_TIMEOUT_S
    args.signals_to_handle = torchrun_signals(args.signals_to_handle)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning banner
    logging.getLogger("torch.distributed").setLevel(logging.CRITICAL)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        # torchrun's elastic modules give their loggers a level of their own (LOGLEVEL, or WARNING), so the
        # one above does not reach them: "Received 10 death signal, shutting down workers" after a save
        if name.startswith("torch.distributed.") and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)
    status_dir = Path(tempfile.mkdtemp(prefix="launch-status-"))
    os.environ[EXIT_STATUS_DIR_VARIABLE] = str(status_dir)
    ranks_started = int(args.nproc_per_node) if str(args.nproc_per_node).isdigit() else -1
    one_node = str(args.nnodes) in ("1", "1:1")
    RestartReporter(status_dir, socket.gethostname(), 0 if one_node else None, ranks_started).listen()
    failure = None
    forwarder = SignalForwarder()
    try:
        try:
            run(args)
        finally:
            forwarder.agent_done = True  # a signal raised before this line is caught below
        status = 0
    except ChildFailedError as failed:
        failure, status = failed, failure_status(failed)
    except SignalException as received:  # torchrun forwarded it to the ranks and waited for them
        status = 128 + int(received.sigval)
    except KeyboardInterrupt:  # SIGINT is the forwarder's: only other code could raise this
        status = 128 + int(signal.SIGINT)
    try:
        if failure is not None:
            say_failure(failure_line(failure, socket.gethostname()), status_dir)
        elif (summary := first_failure(status_dir)) is not None:
            print(summary, file=sys.stderr, flush=True)
        return job_status(recorded_statuses(status_dir), ranks_started, status)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
        # The ranks have exited. Python's exit puts the default action back for each signal that has a
        # Python handler, and SIGUSR1's kills: one arriving then would turn the job's 0 into 138.
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
