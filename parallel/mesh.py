"""The named mesh of parallel dimensions: each dimension's name, size, this rank's coordinate on it and
its group (torchtitan's `ParallelDims`, torchtitan/distributed/parallel_dims.py, is the model).

The dimensions are ordered outermost first, ("pp", "dp", "cp", "tp"), which is Megatron's rank order: TP
fastest, then CP (context parallelism, parallel/context_parallel.py), then DP, then PP (Megatron-Core's
`RankGenerator` with its default order "tp-cp-ep-dp-pp"), so with torchrun/SLURM's node-major ranks a TP
group stays inside a node:

    world 8, TP 2 (PP 1):   rank = (pp x DP + dp) x TP + tp
        tp groups {0,1} {2,3} {4,5} {6,7}     dp groups {0,2,4,6} {1,3,5,7}     pp groups {0} ... {7}

    world 8, PP 2 x TP 2:   pp groups {0,4} {1,5} {2,6} {3,7}   (stage = rank // (DP x TP))

    world 8, CP 2 x TP 2:   rank = (dp x CP + cp) x TP + tp
        tp groups {0,1} {2,3} {4,5} {6,7}     cp groups {0,2} {1,3} {4,6} {5,7}     dp groups {0,4} {1,5} {2,6} {3,7}

Without pipeline stages (or context parallelism) that dimension has size 1: every rank is stage 0 of a pipeline of one. A
group of one is None: collectives over it are skipped (parallel/comm.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

MESH_DIM_NAMES = ("pp", "dp", "cp", "tp")  # outermost first


@dataclass(frozen=True)
class MeshDim:
    name: str
    size: int
    coordinate: int  # this rank's, in [0, size)
    group: Optional[Any] = None  # the process group along this dimension; None while size is 1


@dataclass(frozen=True)
class ParallelDims:
    """This rank's place on the mesh: one MeshDim per name of MESH_DIM_NAMES, in that order."""
    dims: tuple[MeshDim, ...]

    @classmethod
    def of_rank(cls, rank: int, sizes: Mapping[str, int],
                groups: Optional[Mapping[str, Any]] = None) -> "ParallelDims":
        """Rank `rank`'s coordinates on a mesh of `sizes` ({"pp": ..., "dp": ..., "tp": ...}; a missing
        name has size 1), and the groups given for it (a dimension of size 1 gets None)."""
        unknown = set(sizes) - set(MESH_DIM_NAMES)
        if unknown:
            raise ValueError(f"unknown mesh dimensions {sorted(unknown)}; the mesh has {MESH_DIM_NAMES}")
        sizes = {name: sizes.get(name, 1) for name in MESH_DIM_NAMES}
        for name, size in sizes.items():
            if size < 1:
                raise ValueError(f"mesh dimension {name!r} must have size >= 1, got {size}")
        world_size = math.prod(sizes.values())
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size}) for a mesh of {sizes}")
        groups = groups or {}
        coordinates, rest = {}, rank
        for name in reversed(MESH_DIM_NAMES):  # the innermost dimension varies fastest
            rest, coordinates[name] = divmod(rest, sizes[name])
        return cls(tuple(MeshDim(name, sizes[name], coordinates[name], groups.get(name) if sizes[name] > 1 else None)
                         for name in MESH_DIM_NAMES))

    @classmethod
    def single_process(cls) -> "ParallelDims":
        return cls.of_rank(0, {})

    def __getitem__(self, name: str) -> MeshDim:
        for dim in self.dims:
            if dim.name == name:
                return dim
        raise KeyError(f"no mesh dimension {name!r}; the mesh has {MESH_DIM_NAMES}")

    @property
    def sizes(self) -> dict[str, int]:
        return {dim.name: dim.size for dim in self.dims}

    @property
    def coordinates(self) -> dict[str, int]:
        return {dim.name: dim.coordinate for dim in self.dims}

    @property
    def world_size(self) -> int:
        return math.prod(dim.size for dim in self.dims)

    @property
    def rank(self) -> int:
        return self.rank_at(self.coordinates)

    def rank_at(self, coordinates: Mapping[str, int]) -> int:
        """The global rank at `coordinates` (every dimension named)."""
        rank = 0
        for dim in self.dims:
            rank = rank * dim.size + coordinates[dim.name]
        return rank

    def group_ranks(self, name: str) -> list[int]:
        """The global ranks of this rank's group along `name`: its coordinates, `name`'s varied."""
        return [self.rank_at({**self.coordinates, name: index}) for index in range(self[name].size)]
