#!/usr/bin/env python
"""torchrun, ending with the job's own exit status and without torchrun's traceback.

    python scripts/launch.py --standalone --nproc_per_node 8 pretrain_gpt.py --config gpt2-124m ...

Takes exactly torchrun's arguments (it calls torch.distributed.run) and changes three things:

- The exit status is the job's: each rank records the status its error boundary exits with
  (base/errors.py, through ZERO_GPT_EXIT_STATUS_DIR), and the launcher exits with the first non-zero
  one in rank order (2 for a bad input, 130 for Ctrl-C, 0 after a signal-triggered save). torchrun
  itself exits 1 for any failure, and 1 after forwarding SIGTERM even when every rank saved and
  exited 0. A rank that died without recording a status gives torchrun's view: its exit code, or
  128 + the signal that killed it.
- torchrun's own report of a failure (a "ChildFailedError" traceback and log lines on every node)
  is not printed. Where a rank said what went wrong (it recorded a non-zero status: its one line is
  out), nothing is added. Where none did -- a rank killed (SIGKILL, the OOM killer) or crashed, after
  which torchrun's agent stops the survivors with SIGTERM before their heartbeat (parallel/
  liveness.py) can name the dead rank -- the launcher says it, in one line from torchrun's report:
  "launch.py: error: rank 1 (local rank 1 on host h) died: killed by SIGKILL; torchrun stopped the
  other ranks".
- Ranks get --shutdown-timeout 300 unless given: on SIGTERM or SIGINT torchrun forwards the signal
  and, after the timeout, kills; a run with --exit-signal-handler needs that long to save.
"""

from __future__ import annotations

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
    if process.exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-process.exitcode).name}"
        except ValueError:
            how = f"killed by signal {-process.exitcode}"
    else:
        how = f"exited with status {process.exitcode} (see its output above)"
    return (f"launch.py: error: rank {rank} (local rank {process.local_rank} on host {host}) died: {how}; "
            f"torchrun stopped the other ranks")


def main(argv=None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    if args.shutdown_timeout is None and "TORCHELASTIC_SHUTDOWN_TIMEOUT" not in os.environ:
        args.shutdown_timeout = DEFAULT_SHUTDOWN_TIMEOUT_S
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning banner
    logging.getLogger("torch.distributed").setLevel(logging.CRITICAL)
    status_dir = Path(tempfile.mkdtemp(prefix="launch-status-"))
    os.environ[EXIT_STATUS_DIR_VARIABLE] = str(status_dir)
    ranks_started = int(args.nproc_per_node) if str(args.nproc_per_node).isdigit() else -1
    failure = None
    try:
        run(args)
        status = 0
    except ChildFailedError as failed:
        failure, status = failed, failure_status(failed)
    except SignalException as received:  # torchrun forwarded it to the ranks and waited for them
        status = 128 + int(received.sigval)
    except KeyboardInterrupt:
        status = 128 + int(signal.SIGINT)
    try:
        statuses = recorded_statuses(status_dir)
        if failure is not None and not any(statuses.values()):  # no rank said a word: say who died
            print(failure_line(failure, socket.gethostname()), file=sys.stderr, flush=True)
        return job_status(statuses, ranks_started, status)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
