"""Stragglers (--log-straggler): each rank's compute time per log interval, its waits inside collectives taken out,
gathered from every rank, and the slowest and fastest named relative to the median. On CUDA, NCCL's waits stay inside
compute time since its calls return once launched."""

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
    """The `count` slowest and fastest ranks, each with its compute time over the median (ties: lower rank first)."""
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
    def __init__(self, comm: Communicator, count: int) -> None:
        self.comm, self.count = comm, count
        if comm.log is None:
            comm.log = CollectiveLog(capacity=0)
        self.compute_s = 0.0

    def add(self, seconds: float, collective_wait_s: float) -> None:
        self.compute_s += max(seconds - collective_wait_s, 0.0)

    def gather(self) -> Optional[dict[str, list[dict]]]:
        """Every rank's interval compute time (a collective), then the extremes; the interval restarts."""
        compute_s, self.compute_s = self.compute_s, 0.0
        gathered = self.comm.all_gather_object(compute_s)
        self.comm.log.take_wait_s()  # the gather's own wait belongs to no iteration
        return rank_extremes([float(seconds) for seconds in gathered], self.count)
