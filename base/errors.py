"""The errors a bad setting ends in, and `run_tool`, the boundary every entry point runs through: one line on stderr and
exit 2 (Ctrl-C 130, lost peer 3, injected fault 1). It imports neither torch nor the repo, so it works when those
imports fail."""

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
SILENT_RANK_EXIT_DELAY_S = 3.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C
EXIT_PEER_LOST = 3
EXIT_INJECTED_FAULT = 1  # an uncaught exception's status, as Megatron-LM's injected one ends
EXIT_AT_ONCE_WAIT_S = 30.0
_EXITING_AT_ONCE = threading.Event()

# Set by scripts/launch.py: each rank writes its exit status here, so the launcher exits with the job's status.
EXIT_STATUS_DIR_VARIABLE = "ZERO_GPT_EXIT_STATUS_DIR"


class ConfigError(ValueError):
    """A setting that cannot work; `flags`: the option strings it is about, so a caller can say where they came from."""

    def __init__(self, message: str = "", *, flags: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.flags = tuple(flags)


class LaunchEnvironmentError(ConfigError):
    """A malformed launcher variable (RANK, WORLD_SIZE, ...): it may differ per process, so every process prints it."""


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file or keys."""


class PeerLostError(RuntimeError):
    """Another rank died or hung: each survivor prints its own line unless a failed peer speaks for all."""

    def __init__(self, message: str = "", *, speaks: bool = True, status: int = 3) -> None:
        super().__init__(message)
        self.speaks, self.status = speaks, status


class InjectedFault(RuntimeError):
    """A fault the fault injector raised on purpose."""


@dataclass(frozen=True)
class Reporter:
    """Who prints an error raised after the process group exists, and the prefix naming the ranks."""
    speaks: bool
    place: str = ""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that raises ConfigError, so a bad flag is one line and exit 2."""

    def error(self, message: str) -> None:
        raise ConfigError(message)


# Failures every entry point reports in one line.
ALWAYS_EXPECTED: tuple[type[BaseException], ...] = (ConfigError, CheckpointError, OSError, FloatingPointError)


def reporting_process() -> bool:
    """Whether this process prints the error line: rank 0, since every rank meets the same bad input."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    return rank.strip() in ("", "0")


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def run_tool(program: str, action: Callable[[], object],
             expected: tuple[type[BaseException], ...] = ()) -> int:
    """Run an entry point's work: its int or 0; an expected error is one line and 2; anything else keeps its
    traceback."""
    reporter: Optional[Reporter] = None
    try:
        try:
            result = action()
        finally:
            _wait_for_exit_at_once()
        status = result if isinstance(result, int) and not isinstance(result, bool) else 0
    except KeyboardInterrupt:
        _report(f"{program}: interrupted (SIGINT); stopped without saving")
        status = EXIT_INTERRUPTED
    except PeerLostError as error:
        if getattr(error, "speaks", True):
            print(f"{program}: error: {one_line(error)}", file=sys.stderr, flush=True)
        status = getattr(error, "status", EXIT_PEER_LOST)
    except LaunchEnvironmentError as error:
        print(f"{program}: error: {one_line(error)}", file=sys.stderr, flush=True)
        status = EXIT_BAD_INPUT
    except (InjectedFault,) + ALWAYS_EXPECTED + tuple(expected) as error:
        reporter = _report_error(program, error)
        status = EXIT_INJECTED_FAULT if isinstance(error, InjectedFault) else EXIT_BAD_INPUT
    except KeyError as error:
        _report(f"{program}: error: the checkpoint's metadata has no {error} entry; is it from another tool?")
        status = EXIT_BAD_INPUT
    _record_exit_status(status)
    speaks = reporter.speaks if reporter is not None else reporting_process()
    if status == EXIT_BAD_INPUT and not speaks and os.environ.get("TORCHELASTIC_RUN_ID"):
        # Under torchrun a silent rank exiting first can make the agent stop rank 0 before its line is out.
        time.sleep(SILENT_RANK_EXIT_DELAY_S)
    return status


def _report_error(program: str, error: BaseException) -> Reporter:
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
    """run_tool's line and status for a lost peer, from a watchdog thread: print, record, os._exit; other threads' later
    errors are silenced."""
    _EXITING_AT_ONCE.set()
    sys.excepthook = threading.excepthook = _silent
    try:
        sys.stdout.flush()
        if error is not None:
            print(f"{program}: error: {one_line(error)}", file=sys.stderr, flush=True)
    finally:
        _record_exit_status(status)
        os._exit(status)


def _report(line: str) -> None:
    if reporting_process():
        print(line, file=sys.stderr, flush=True)


def _silent(*args) -> None:
    _wait_for_exit_at_once()


def _wait_for_exit_at_once() -> None:
    """Once a thread is in exit_at_once, no other ends the process first."""
    if _EXITING_AT_ONCE.is_set():
        time.sleep(EXIT_AT_ONCE_WAIT_S)
        os._exit(EXIT_PEER_LOST)


def _record_failure(line: str) -> None:
    directory = os.environ.get(EXIT_STATUS_DIR_VARIABLE)
    if not directory:
        return
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    try:
        (Path(directory) / f"failure{rank}").write_text(json.dumps({"time": time.time(), "line": line}))
    except OSError:
        pass


def _record_exit_status(status: int) -> None:
    directory = os.environ.get(EXIT_STATUS_DIR_VARIABLE)
    if not directory:
        return
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    try:
        (Path(directory) / f"rank{rank}").write_text(f"{status}\n")
    except OSError:
        pass
