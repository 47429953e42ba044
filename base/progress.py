"""Progress lines for long work (tokenizer training, index building): a start line, at most one update every
`interval_s`, and an end line with the time taken; on stdout, from rank 0."""

from __future__ import annotations

import time
from typing import Callable, Optional

from base.errors import reporting_process

REPORT_EVERY_S = 10.0


def print_line(line: str) -> None:
    if reporting_process():
        print(line, flush=True)


class ProgressLines:
    def __init__(self, emit: Optional[Callable[[str], None]] = print_line, interval_s: float = REPORT_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter):
        self.emit = emit or (lambda line: None)
        self.interval_s = interval_s
        self.clock = clock
        self.started = self.last = clock()

    def start(self, line: str) -> None:
        self.started = self.last = self.clock()
        self.emit(line)

    def update(self, describe: Callable[[], str]) -> None:
        """Print `describe()` if `interval_s` has passed since the last line; otherwise build nothing."""
        now = self.clock()
        if now - self.last >= self.interval_s:
            self.last = now
            self.emit(f"{describe()} ({now - self.started:.0f} s so far)")

    def shown_alive(self) -> None:
        """Another line has just shown the work is alive: the next update waits a whole interval again."""
        self.last = self.clock()

    def done(self, line: str) -> None:
        self.emit(f"{line} in {self.clock() - self.started:.1f} s")
