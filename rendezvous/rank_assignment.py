"""Which process trains as which rank in each incarnation of an in-process restart, with hot spares.

Megatron-LM (megatron/training/inprocess_restart.py) hands nvidia-resiliency-ext's Wrapper a
`rank_assignment.Tree` of one layer at `--inprocess-granularity rank`: `Layer(min_ranks=active, max_ranks=active,
flag=RESERVE)` with active = --inprocess-active-world-size, and `RetryController(min_world_size=active)`. What that
tree does (nvidia_resiliency_ext/inprocess/rank_assignment.py, `Tree`):

- at the start, the launch ranks are visited in order and the first `active` are activated with their own
  index; the rest are inactive (hot spares: alive, not in the process group);
- after a fault, a terminated active rank is replaced by an inactive one (`replace_with_inactive`: the root's
  `inactive_nodes.popitem()`, the most recently deactivated spare, i.e. the highest launch rank left), which
  takes the terminated rank's index; ranks keep their index otherwise;
- with fewer survivors than `active` the root layer's min_ranks terminates the whole tree and RetryController
  ends the job (no smaller world is formed).

Pure: the caller (resilience/inprocess_restart.py) agrees on the terminated launch ranks through the store and
hands them here; every process computes the same assignment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional


class TooFewProcesses(RuntimeError):
    """Fewer processes alive than the active world size: the job cannot go on (RetryController's min_world_size)."""


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
    """The first `active_world_size` launch ranks train with their own index; the rest are spares."""
    if active_world_size > world_size:
        raise TooFewProcesses(f"--inprocess-active-world-size {active_world_size} is more than the {world_size} "
                              f"launched processes")
    return Assignment({launch: (launch if launch < active_world_size else None) for launch in range(world_size)},
                      active_world_size)


def reassign(previous: Assignment, terminated: Iterable[int]) -> Assignment:
    """The next incarnation's assignment once the launch ranks `terminated` are gone: each terminated active
    rank's index goes to the spare with the highest launch rank left, in the order of the terminated indices."""
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
