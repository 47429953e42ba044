"""What `python -m zero.plan search` says on stderr while it works, so a long search is visibly alive: the layouts
counted (at most a line every `INTERVAL_S`), the best by the count, then a line around each dry run of the check. stdout
keeps only the answer."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional

from base.progress import ProgressLines
from planner.layout_perf import Layout
from planner.layout_zero import zero_label

INTERVAL_S = 2.0


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def layout_label(layout: Layout) -> str:
    """A layout in a few words: its parallel sizes, micro-batch, ZeRO and recompute."""
    sizes = [f"{name} {size}" for name, size in (("TP", layout.tp), ("PP", layout.pp), ("VP", layout.vp),
                                                 ("CP", layout.cp), ("EP", layout.ep)) if size > 1]
    recompute = ", full recompute" if layout.recompute_fraction >= 1.0 else ""
    zero = zero_label(layout.stage).split(" (")[0] if layout.stage else "no ZeRO"
    return " x ".join(sizes + [f"DP {layout.dp}"]) + f", MBS {layout.micro_batch_size}, {zero}{recompute}"


class SearchProgress:
    """The search's stderr lines; `emit` None says nothing."""

    def __init__(self, emit: Optional[Callable[[str], None]] = stderr_line, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.perf_counter):
        self.emit = emit or (lambda line: None)
        self.lines = ProgressLines(self.emit, interval_s, clock)
        self.dry_runs = 0

    def started(self, gpus: int) -> None:
        self.lines.start(f"search: enumerating the layouts on {gpus:,} GPUs")

    def counting(self, counted: int, fitting: int) -> None:
        """Called for every layout; prints at most every interval."""
        self.lines.update(lambda: f"search: {counted:,} layouts counted, {fitting:,} fit by the count")

    def ranked(self, counted: int, fitting: int, best: Optional[Layout], best_step_s: float) -> None:
        best_text = f"; best by the count {layout_label(best)} at {best_step_s * 1e3:,.1f} ms/step" if best else ""
        self.emit(f"search: {counted:,} layouts counted, {fitting:,} fit by the count{best_text} "
                  f"({self.lines.clock() - self.lines.started:.1f} s)")

    def dry_run_started(self, layout: Layout, cap: int) -> None:
        self.dry_runs += 1
        self.emit(f"search: dry run {self.dry_runs} (at most {cap}) of {layout_label(layout)}")

    def dry_run_done(self, verdict: str, best: Optional[tuple[Layout, float, int]]) -> None:
        """`verdict`: what this dry run found; `best`: the best layout that fits by the dry run so far, its step and
        bytes."""
        best_text = (f"; best so far {layout_label(best[0])} at {best[1] * 1e3:,.1f} ms/step, "
                     f"{best[2] / 2 ** 30:,.2f} GiB" if best else "; none fits yet")
        self.emit(f"search:   {verdict}{best_text} ({self.lines.clock() - self.lines.started:.1f} s)")
        self.lines.shown_alive()

    def dry_run_line(self, line: str) -> None:
        """A line of the dry run's own (a long plan's progress), passed on."""
        self.emit(f"search:   {line.lstrip('> ')}")
