"""The rank monitor of --enable-ft-package, as nvidia-resiliency-ext's rank monitor server: a process beside each rank
that kills it when a section or the time outside them overruns, so a stopped or GIL-stuck rank still ends.

python -m resilience.ft_monitor PID RANK WARMUP_ITERS TIMEOUTS_JSON
stdin lines: open|close <section>, timeouts <json>, iterations <n>"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Optional, TextIO

CHECK_INTERVAL_S = 0.1


class SectionClock:
    def __init__(self, timeouts: dict[str, Optional[float]], warmup_iterations: int, now: float) -> None:
        self.timeouts = dict(timeouts)
        self.warmup_iterations = warmup_iterations
        self.open: dict[str, float] = {}
        self.out_of_section_since = now
        self.iterations = 0

    def event(self, line: str, now: float) -> None:
        word, _, rest = line.strip().partition(" ")
        if word == "open":
            self.open[rest] = now
        elif word == "close":
            self.open.pop(rest, None)
            if not self.open:
                self.out_of_section_since = now
        elif word == "timeouts":
            self.timeouts.update(json.loads(rest))
        elif word == "iterations":
            self.iterations = int(rest)

    def overrun(self, now: float) -> Optional[tuple[str, float, float]]:
        """(section, how long open, its timeout) for the first past its timeout, else None."""
        for section, since in self.open.items():
            timeout = self.timeouts.get(section)
            if timeout is not None and now - since > timeout:
                return section, now - since, timeout
        timeout = self.timeouts.get("out_of_section")
        if not self.open and timeout is not None and self.iterations >= self.warmup_iterations \
                and now - self.out_of_section_since > timeout:
            return "out-of-section", now - self.out_of_section_since, timeout
        return None


def monitor(events: TextIO, rank_pid: int, rank: int, clock: SectionClock) -> int:
    buffer = ""
    while True:
        readable, _, _ = select.select([events], [], [], CHECK_INTERVAL_S)
        now = time.monotonic()
        if readable:
            chunk = os.read(events.fileno(), 65536).decode()
            if not chunk:
                return 0
            buffer += chunk
            *lines, buffer = buffer.split("\n")
            for line in lines:
                clock.event(line, now)
        overrun = clock.overrun(now)
        if overrun is not None:
            section, elapsed, timeout = overrun
            what = "time out of any section" if section == "out-of-section" else f"{section} section"
            print(f"pretrain_gpt.py: error: rank {rank}: its {what} has run {elapsed:.1f} s, over its "
                  f"{timeout:g} s timeout (--enable-ft-package): the rank monitor ends it with SIGKILL so that the "
                  f"launcher restarts the job (--max-restarts) from the latest checkpoint", file=sys.stderr, flush=True)
            try:
                os.kill(rank_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return 0


def main(argv: list[str]) -> int:
    rank_pid, rank, warmup, timeouts = int(argv[0]), int(argv[1]), int(argv[2]), json.loads(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the rank's to handle; the pipe's end ends this
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # likewise torchrun's SIGTERM
    return monitor(sys.stdin, rank_pid, rank, SectionClock(timeouts, warmup, time.monotonic()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
