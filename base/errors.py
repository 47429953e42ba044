"""The error every bad setting ends in, and the one boundary every entry point runs through.

`ConfigError` and `CheckpointError` have their own module so that the modules raising them
(arguments.config and zero.config; the checkpoint format, schema and integrity checks) need not import
each other in a cycle; arguments.config and checkpoint.format re-export them. `run_tool` is the boundary: the training
program, `python -m data.preprocess` and every script in scripts/ call their work through it, so a
bad input anywhere ends the same way -- one line `program: error: ...` on stderr and exit status 2 --
and Ctrl-C ends in one line and status 130 instead of a traceback. A peer rank that died or hung
(`PeerLostError`) is one line from every surviving rank and status 3. An error met after the process
group exists carries a `Reporter` (rendezvous/failure_report.py decides it): which rank prints it, naming
whom; a fault from the fault injector (`InjectedFault`, resilience/fault_injection.py) is one line from the
rank it was injected on and status 1, the status of Megatron-LM's uncaught InjectedException. Nothing here
imports torch or the rest of the repo: the boundary must work even when those imports are what fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

EXIT_BAD_INPUT = 2
SILENT_RANK_EXIT_DELAY_S = 3.0  # how long a rank that does not print a bad-input error waits before exiting
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C
EXIT_PEER_LOST = 3  # another rank died or hung (rendezvous/liveness.py); this one stopped too
EXIT_INJECTED_FAULT = 1  # an uncaught exception's status, as Megatron-LM's injected one ends
EXIT_AT_ONCE_WAIT_S = 30.0  # how long another thread waits for exit_at_once's os._exit before making it itself
_EXITING_AT_ONCE = threading.Event()  # set by exit_at_once: the process is ending with a lost peer's status

# Set by scripts/launch.py: each rank writes its exit status here, so the launcher can exit with the
# job's own status instead of torchrun's generic 1.
EXIT_STATUS_DIR_VARIABLE = "ZERO_GPT_EXIT_STATUS_DIR"


class ConfigError(ValueError):
    """A setting that cannot work. The message names the flag(s) involved, and `flags` carries the
    option strings whose values it is about ("--zero-stage", in the order the message names them), so
    that a caller can say where those values came from (arguments/config_sources.py) without reading
    the text back. A flag the message names only as a fix to type (`--no-bf16`) or a pointer elsewhere
    is not one of them: its value is not what went wrong."""

    def __init__(self, message: str = "", *, flags: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.flags = tuple(flags)


class LaunchEnvironmentError(ConfigError):
    """A launcher's environment variable (RANK, WORLD_SIZE, MASTER_PORT, SLURM_PROCID, ...) that is
    malformed or inconsistent. Unlike other bad inputs it need not be the same on every process, and
    a process with a bad RANK cannot know whether it is rank 0: every process prints it."""


class CheckpointError(Exception):
    """A checkpoint that cannot be used (missing, incomplete, corrupt, or for another model); the
    message names the file or the keys. Defined here so the checkpoint modules can share it without
    importing each other; checkpoint.format re-exports it."""


class PeerLostError(RuntimeError):
    """Another rank stopped answering (died, or hung). Unlike a bad input, which every rank meets and
    rank 0 reports, only the survivors know of it, and any of them may be the only one left to tell:
    each prints its own line. A peer whose collective work failed (rendezvous/liveness.py) prints its own
    line instead: this rank then `speaks` not and ends with that peer's `status`."""

    def __init__(self, message: str = "", *, speaks: bool = True, status: int = 3) -> None:
        super().__init__(message)
        self.speaks, self.status = speaks, status


class InjectedFault(RuntimeError):
    """A fault the fault injector raised on purpose (nvidia-resiliency-ext's InjectedException): the
    message names the fault and the flags that asked for it."""


@dataclass(frozen=True)
class Reporter:
    """Who prints an error this rank raised after the process group exists (rendezvous/failure_report.py):
    `speaks` on this rank, and `place` prefixes the message ("rank 1 (TP 1/2, ...)", "ranks 1, 3"); an
    empty place is an error every rank met, printed plainly."""
    speaks: bool
    place: str = ""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing the usage block and exiting, so a bad
    flag is reported like every other bad input: one line, exit 2."""

    def error(self, message: str) -> None:
        raise ConfigError(message)


# Failures of the input or the environment that every entry point reports as one line; each entry
# point adds its own domain errors (DataError). OSError covers unreadable and
# unwritable paths and full disks; FloatingPointError a run that diverged.
ALWAYS_EXPECTED: tuple[type[BaseException], ...] = (ConfigError, CheckpointError, OSError, FloatingPointError)


def reporting_process() -> bool:
    """Whether this process prints the error line. Under torchrun or SLURM every rank meets the same
    bad input (the ranks agree on every check before raising), so only rank 0 speaks."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    return rank.strip() in ("", "0")


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def run_tool(program: str, action: Callable[[], object],
             expected: tuple[type[BaseException], ...] = ()) -> int:
    """Run an entry point's work: its own exit status (an int it returns) or 0 on success; an
    expected error is one line `program: error: ...` on stderr and status 2; Ctrl-C (when nothing
    else handles SIGINT) is one line and status 130. Anything else is a bug and keeps its traceback."""
    reporter: Optional[Reporter] = None
    try:
        try:
            result = action()
        finally:
            _wait_for_exit_at_once()  # a watchdog thread ending the process has the last word (exit_at_once)
        status = result if isinstance(result, int) and not isinstance(result, bool) else 0
    except KeyboardInterrupt:
        _report(f"{program}: interrupted (SIGINT); stopped without saving")
        status = EXIT_INTERRUPTED
    except PeerLostError as error:  # each survivor's own line, unless the survivors agreed one speaks for all
        if getattr(error, "speaks", True):
            print(f"{program}: error: {one_line(error)}", file=sys.stderr, flush=True)
        status = getattr(error, "status", EXIT_PEER_LOST)
    except LaunchEnvironmentError as error:
        print(f"{program}: error: {one_line(error)}", file=sys.stderr, flush=True)
        status = EXIT_BAD_INPUT
    except (InjectedFault,) + ALWAYS_EXPECTED + tuple(expected) as error:
        reporter = _report_error(program, error)
        status = EXIT_INJECTED_FAULT if isinstance(error, InjectedFault) else EXIT_BAD_INPUT
    except KeyError as error:  # a metadata.json that parses but lacks an entry every save writes
        _report(f"{program}: error: the checkpoint's metadata has no {error} entry; is it from another tool?")
        status = EXIT_BAD_INPUT
    _record_exit_status(status)
    speaks = reporter.speaks if reporter is not None else reporting_process()
    if status == EXIT_BAD_INPUT and not speaks and os.environ.get("TORCHELASTIC_RUN_ID"):
        # Every rank met the same bad input and only rank 0 prints it. Under torchrun a silent rank that
        # exits first makes the agent stop the others, rank 0 included, perhaps before its line is out
        # (seen on a loaded machine): wait a little.
        time.sleep(SILENT_RANK_EXIT_DELAY_S)
    return status


def _report_error(program: str, error: BaseException) -> Reporter:
    """Print an expected error as its Reporter says (rank 0 alone without one: a bad input met before the
    process group, by every rank alike); a rank's own error is also left for scripts/launch.py."""
    reporter = getattr(error, "reporter", None)
    if not isinstance(reporter, Reporter):
        reporter = Reporter(speaks=reporting_process())
    line = f"{program}: error: {reporter.place + ': ' if reporter.place else ''}{one_line(error)}"
    if reporter.speaks:
        print(line, file=sys.stderr, flush=True)
    if reporter.place:
        _record_failure(line)
    return reporter


def exit_at_once(program: str, error: Optional[PeerLostError], status: int = EXIT_PEER_LOST) -> None:
    """run_tool's line and status for a lost peer, from a watchdog thread while the main thread may be
    blocked in a collective that never returns: print, record the status, and end the process
    without unwinding (os._exit), since no cleanup could get past that collective anyway. Without an
    error, nothing is printed: a peer whose collective work failed prints its own line, and this rank ends
    with that rank's `status` (rendezvous/liveness.py).

    The line is the process's last word: another thread's error from here on is the shutdown's
    consequence (a DataLoader worker resetting the connection multiprocessing's resource sharer was
    serving it, seen when a stopped rank was continued), so sys.excepthook and threading.excepthook,
    through which such threads print, are silenced first."""
    _EXITING_AT_ONCE.set()
    sys.excepthook = threading.excepthook = _silent
    try:
        sys.stdout.flush()  # what the run printed so far comes before the line, as it would in run_tool
        if error is not None:
            print(f"{program}: error: {one_line(error)}", file=sys.stderr, flush=True)
    finally:
        _record_exit_status(status)
        os._exit(status)


def _report(line: str) -> None:
    if reporting_process():
        print(line, file=sys.stderr, flush=True)


def _silent(*args) -> None:
    """An exception hook that prints nothing (exit_at_once) and leaves the end to it: an exception reaching the main
    thread's hook would otherwise end the process first, with status 1."""
    _wait_for_exit_at_once()


def _wait_for_exit_at_once() -> None:
    """Once a thread is in exit_at_once, no other may end the process before it: the main thread returning from, or
    failing out of, its work meanwhile (its collective broken by the peers that gave up) would end it with another
    status, or a second line (CI saw a continued rank exit with a status other than 3 after its one line). Its os._exit
    comes within moments; the bound is for a thread stuck writing its line."""
    if _EXITING_AT_ONCE.is_set():
        time.sleep(EXIT_AT_ONCE_WAIT_S)
        os._exit(EXIT_PEER_LOST)


def _record_failure(line: str) -> None:
    """For scripts/launch.py's summary: when this rank failed on an error of its own, and its line."""
    directory = os.environ.get(EXIT_STATUS_DIR_VARIABLE)
    if not directory:
        return
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    try:
        (Path(directory) / f"failure{rank}").write_text(json.dumps({"time": time.time(), "line": line}))
    except OSError:
        pass  # the launcher then says less


def _record_exit_status(status: int) -> None:
    directory = os.environ.get(EXIT_STATUS_DIR_VARIABLE)
    if not directory:
        return
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    try:
        (Path(directory) / f"rank{rank}").write_text(f"{status}\n")
    except OSError:
        pass  # the launcher then falls back to torchrun's own status
