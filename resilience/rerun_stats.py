"""--rerun-mode report_stats: how much a re-run of the same iteration differs from its first run, as Megatron-Core's
rerun state machine reports it in its REPORT_DETERMINISM_STATS mode (megatron/core/rerun_state_machine.py,
QuickStats and RerunStateMachine._maybe_report_stats).

Every iteration runs twice from the same micro-batches and RNG states (resilience/rerun_state.py); each validated
result of the re-run is compared with the first run's (the relative difference, 0 when equal) and the difference
recorded under its validation's message. Every REPORTING_INTERVAL_ITERATIONS iterations the first rank gathers
every rank's records, adds them to its own (kept from the start of the job; the other ranks forget what they
sent) and prints, per message, Megatron's line:

    Stats on computation determinism in validation calls
      From validation call 'found NaN in local forward loss calculation':
        16/12 total/identical samples, rel. variability: avg= 1.250E-08, p50= 0.0, p90= ..., max: 5.960E-08

(or "16 samples, all identical"). On a CPU in fp32 the re-run is bitwise the first run: every sample is identical.
"""

from __future__ import annotations

from typing import Callable, Optional

REPORTING_INTERVAL_ITERATIONS = 2  # RerunStateMachine.REPORTING_INTERVAL_ITERATIONS
QUICK_STATS_MAX_SIZE = 100000  # QuickStats' max_size


class QuickStats:
    """Megatron-Core's QuickStats: the non-zero differences (at most `max_size`, the oldest overwritten in a ring)
    and the count of zero ones, their maximum, and a one-line summary of their distribution."""

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
        """Other ranks' records added to these. As Megatron's: their samples are appended only while the whole
        stays within max_size (else only their zero counts and maxima are taken)."""
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
        """Megatron's summary, character for character: the percentiles count the identical samples as the lowest
        (a percentile that falls among them prints 0.0)."""
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


# Every rank's {message: QuickStats}, the list on the first rank, None on the others (one process: [its own]).
GatherToFirst = Callable[[dict], Optional[list]]


def report_stats(stats: dict[str, QuickStats], gather_to_first: GatherToFirst, log: Callable[[str], None]) -> None:
    """Megatron's _maybe_report_stats once the interval is due: every rank's records to the first, which combines
    them into its own and logs one summary per validation message; the other ranks start afresh."""
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
