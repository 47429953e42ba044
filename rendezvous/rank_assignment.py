"""Which process trains as which rank in each incarnation of an in-process restart with hot spares, as
nvidia-resiliency-ext's rank_assignment.Tree does at `--inprocess-granularity rank`. Pure: every process computes the
same assignment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional


class TooFewProcesses(RuntimeError):
    """Fewer live processes than the active world size: the job ends (RetryController's min_world_size)."""


@dataclass(frozen=True)
class Assignment:
    """launch rank -> rank in this incarnation's process group (None: a spare) for every live process."""
    active_ranks: dict[int, Optional[int]]
    active_world_size: int

    def rank_of(self, launch_rank: int) -> Optional[int]:
        return self.active_ranks[launch_rank]

    def spares(self) -> list[int]:
        return sorted(launch for launch, rank in self.active_ranks.items() if rank is None)

    def launch_rank_of(self, rank: int) -> int:
        return next(launch for launch, active in self.active_ranks.items() if active == rank)


def first_assignment(world_size: int, active_world_size: int) -> Assignment:
    if active_world_size > world_size:
        raise TooFewProcesses(f"--inprocess-active-world-size {active_world_size} is more than the {world_size} "
                              f"launched processes")
    return Assignment({launch: (launch if launch < active_world_size else None) for launch in range(world_size)},
                      active_world_size)


def reassign(previous: Assignment, terminated: Iterable[int]) -> Assignment:
    """The next assignment once `terminated` are gone: each terminated rank's index goes to the spare with the highest
    launch rank left."""
    gone = set(terminated)
    alive = {launch: rank for launch, rank in previous.active_ranks.items() if launch not in gone}
    if len(alive) < previous.active_world_size:
        raise TooFewProcesses(f"{len(alive)} processes left of the {previous.active_world_size} that train "
                              f"(--inprocess-active-world-size) and no spare to take a terminated rank's place")
    vacant = sorted(previous.active_ranks[launch] for launch in gone
                    if launch in previous.active_ranks and previous.active_ranks[launch] is not None)
    spares = sorted((launch for launch, rank in alive.items() if rank is None), reverse=True)
    for index, spare in zip(vacant, spares):
        alive[spare] = index
    return Assignment(alive, previous.active_world_size)
