"""What a restart cost: rank 0 keeps the last finished iteration and its time in `<save>/restart_progress.json`, and a
restarted incarnation says, once back at that iteration, how many iterations were redone and how long recovery took."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Mapping, Optional

PROGRESS_FILE = "restart_progress.json"
INPROCESS_RESTART = "INPROCESS_RESTART_ITERATION"  # this incarnation, 0 for the first
INPROCESS_MAX_ITERATIONS = "INPROCESS_MAX_ITERATIONS"  # --inprocess-max-iterations, 0 for no bound


def restarts_possible(environ: Mapping[str, str]) -> bool:
    return int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0 or INPROCESS_RESTART in environ


def restart_count(environ: Mapping[str, str]) -> tuple[int, str]:
    """This start's restart number and how the line names it."""
    if INPROCESS_RESTART in environ:
        bound = int(environ.get(INPROCESS_MAX_ITERATIONS, "0") or 0)
        restart = int(environ[INPROCESS_RESTART])
        return restart, f"in-process restart {restart}" + (f" of {bound - 1}" if bound else "")
    restart = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return restart, f"torchrun restart {restart} of {int(environ.get('TORCHELASTIC_MAX_RESTARTS', '0') or 0)}"


class RestartProgress:
    """Rank 0's record of progress, and after a restart the line that says what the fault cost."""

    def __init__(self, save_dir: str, start_iteration: int, environ: Mapping[str, str], log: Callable[[str], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(save_dir) / PROGRESS_FILE
        self.restart, self.restart_name = restart_count(environ)
        self.start_iteration = start_iteration
        self.log, self.clock = log, clock
        self.before: Optional[dict] = None
        if self.restart > 0 and self.path.exists():
            try:
                self.before = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self.before = None  # half-written by a rank killed mid-write
        self.first_done_after_s: Optional[float] = None

    def finished(self, iteration: int) -> None:
        now = self.clock()
        if self.before is not None:
            since_fault = now - self.before["time"]
            if self.first_done_after_s is None:
                self.first_done_after_s = since_fault
            if iteration >= self.before["iteration"]:
                self.log(self._recovery_line(since_fault))
                self.before = None
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"iteration": iteration, "time": now}))
        os.replace(temporary, self.path)

    def _recovery_line(self, back_after_s: float) -> str:
        reached, resumed = self.before["iteration"], self.start_iteration
        redone = reached - resumed
        lost = ("no iteration redone" if redone <= 0 else
                f"iteration {resumed + 1} redone" if redone == 1 else f"iterations {resumed + 1}-{reached} redone")
        return (f"> recovered ({self.restart_name}): the previous incarnation had "
                f"finished iteration {reached}, this one resumed from the checkpoint at iteration {resumed}: {lost}; "
                f"{self.first_done_after_s:.1f} s from iteration {reached}'s end to the first iteration after the "
                f"restart, {back_after_s:.1f} s to iteration {reached} again")
