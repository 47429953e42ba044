"""Stragglers: each rank's compute time over a log interval, its waits inside collectives taken out, gathered
from every rank, and the --straggler-minmax-count slowest and fastest named with their time relative to the
median (Megatron-LM's --log-straggler, --straggler-minmax-count, --disable-straggler-on-startup:
megatron/training/training.py reports through its StragglerDetector the ranks of lowest and highest estimated
throughput each log interval; nvidia-resiliency-ext's straggler module scores each rank relative to the
median as here).

A rank that computes slowly makes its peers wait for it in the next collective: their iteration times are
the same, and only the time outside collectives tells which rank held the others up. The wait is measured
on the host around each collective call (rendezvous/collective_log.py): exact for gloo, whose calls block; a
CUDA run's NCCL calls return once launched, so there the device's waits stay inside the compute time.

One all_gather_object of a float per rank every log interval, only when on.
"""

from __future__ import annotations

import statistics
from typing import Optional

from parallel.comm import Communicator
from rendezvous.collective_log import CollectiveLog


def straggler_notes(log_straggler: bool, disable_on_startup: bool) -> list[str]:
    """The start-up line for a difference from Megatron-LM."""
    if log_straggler and disable_on_startup:
        return ["--disable-straggler-on-startup: the straggler report starts off, and stays off here (Megatron-LM "
                "switches it on through --straggler-ctrlr-port, a control server that does not exist here)"]
    return []


def rank_extremes(compute_s: list[float], count: int) -> dict[str, list[dict]]:
    """The `count` slowest and fastest ranks, each with its compute time over the median of all ranks'
    (ties: the lower rank first)."""
    median = statistics.median(compute_s)
    relative = [(seconds / median if median > 0 else 1.0) for seconds in compute_s]
    order = sorted(range(len(compute_s)), key=lambda rank: (compute_s[rank], rank))
    count = min(count, len(compute_s))

    def entries(ranks):
        return [{"rank": rank, "relative": round(relative[rank], 4)} for rank in ranks]

    return {"slowest": entries(sorted(order, key=lambda rank: (-compute_s[rank], rank))[:count]),
            "fastest": entries(order[:count])}


def format_stragglers(report: dict[str, list[dict]]) -> str:
    def ranks(entries):
        return ", ".join(f"rank {entry['rank']} ({entry['relative']:.2f}x)" for entry in entries)

    return f"slowest: {ranks(report['slowest'])}; fastest: {ranks(report['fastest'])} (compute vs median)"


class StragglerReport:
    """This rank's compute seconds in the current interval, and the gathered report at its end."""

    def __init__(self, comm: Communicator, count: int) -> None:
        self.comm, self.count = comm, count
        if comm.log is None:  # the flight recorder's ring may already be there; else only the wait clock
            comm.log = CollectiveLog(capacity=0)
        self.compute_s = 0.0

    def add(self, seconds: float, collective_wait_s: float) -> None:
        self.compute_s += max(seconds - collective_wait_s, 0.0)

    def gather(self) -> Optional[dict[str, list[dict]]]:
        """Every rank's interval compute time (a collective: every rank calls it at the same iteration), then the
        extremes; this rank's interval starts again."""
        compute_s, self.compute_s = self.compute_s, 0.0
        gathered = self.comm.all_gather_object(compute_s)
        self.comm.log.take_wait_s()  # the gather's own wait belongs to no iteration
        return rank_extremes([float(seconds) for seconds in gathered], self.count)
