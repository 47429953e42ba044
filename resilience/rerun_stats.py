"""--rerun-mode report_stats: how much a re-run of an iteration differs from its first run, per validation message,
printed in Megatron-Core's words every REPORTING_INTERVAL_ITERATIONS iterations after the first rank gathers every
rank's records."""

from __future__ import annotations

from typing import Callable, Optional

REPORTING_INTERVAL_ITERATIONS = 2  # RerunStateMachine.REPORTING_INTERVAL_ITERATIONS
QUICK_STATS_MAX_SIZE = 100000  # QuickStats' max_size


class QuickStats:
    """Megatron-Core's QuickStats: the non-zero differences (a ring of `max_size`), the count of zero ones, their
    maximum and a one-line summary."""

    def __init__(self, max_size: int = QUICK_STATS_MAX_SIZE) -> None:
        self.samples: list[float] = []
        self.pos = 0
        self.zero_cnt = 0
        self.max = 0.0
        self.max_size = max_size

    def record(self, data: float) -> None:
        if data == 0.0:
            self.zero_cnt += 1
            return
        if self.pos < self.max_size:
            self.samples.append(data)
        else:
            self.samples[self.pos % self.max_size] = data
        self.pos += 1
        self.max = max(self.max, data)

    def combine(self, others: list["QuickStats"]) -> None:
        """Add other ranks' records; as Megatron's, their samples only while the whole fits max_size."""
        if not others:
            return
        n = len(self.samples) + sum(len(other.samples) for other in others)
        if n <= self.max_size:
            for other in others:
                self.samples.extend(other.samples)
            self.pos = n
        self.zero_cnt += sum(other.zero_cnt for other in others)
        self.max = max(self.max, max(other.max for other in others))

    def reset(self) -> None:
        self.samples, self.pos, self.zero_cnt, self.max = [], 0, 0, 0.0

    def print_stats(self) -> str:
        """Megatron's summary, character for character (identical samples count as the lowest percentiles)."""
        self.samples.sort()
        z, n = self.zero_cnt, len(self.samples)
        if n == 0:
            return f"{z:,} samples, all identical"
        t = z + n
        average = sum(self.samples) / t
        percentiles = {p: f"{self.samples[int(t * p) - z]:.3E}" if int(t * p) - z >= 0 else "0.0"
                       for p in (0.5, 0.9, 0.99, 0.999)}
        return (f"{t:,}/{z:,} total/identical samples, rel. variability: avg= {average:.3E}, "
                f"p50= {percentiles[0.5]}, p90= {percentiles[0.9]}, p99= {percentiles[0.99]}, "
                f"p99.9= {percentiles[0.999]}, max: {self.max:.3E}")


# Every rank's {message: QuickStats}: the list on the first rank, None on the others.
GatherToFirst = Callable[[dict], Optional[list]]


def report_stats(stats: dict[str, QuickStats], gather_to_first: GatherToFirst, log: Callable[[str], None]) -> None:
    """Once the interval is due: every rank's records to the first, which logs one summary per message; the others start
    afresh."""
    gathered = gather_to_first(dict(stats))
    if gathered is None:
        for recorded in stats.values():
            recorded.reset()
        return
    messages = list(dict.fromkeys(message for rank_stats in gathered for message in rank_stats))
    log("Stats on computation determinism in validation calls")
    for message in messages:
        mine = stats.setdefault(message, QuickStats())
        mine.combine([rank_stats[message] for rank_stats in gathered[1:] if message in rank_stats])
        log(f"  From validation call '{message}':")
        log(f"    {mine.print_stats()}")
