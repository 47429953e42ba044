"""The named mesh of parallel dimensions (torchtitan's ParallelDims): each dimension's size, this rank's coordinate and
its group, outermost first ("pp", "dp", "cp", "tp"), Megatron's rank order with TP fastest so a TP group stays inside a
node. A group of one is None: collectives over it are skipped."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

MESH_DIM_NAMES = ("pp", "dp", "cp", "tp")  # outermost first


@dataclass(frozen=True)
class MeshDim:
    name: str
    size: int
    coordinate: int
    group: Optional[Any] = None  # None while size is 1


@dataclass(frozen=True)
class ParallelDims:
    """This rank's place on the mesh: one MeshDim per name of MESH_DIM_NAMES, in that order."""
    dims: tuple[MeshDim, ...]

    @classmethod
    def of_rank(cls, rank: int, sizes: Mapping[str, int],
                groups: Optional[Mapping[str, Any]] = None) -> "ParallelDims":
        """Rank `rank`'s coordinates on a mesh of `sizes` (a missing name has size 1), with the groups given for it."""
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
        rank = 0
        for dim in self.dims:
            rank = rank * dim.size + coordinates[dim.name]
        return rank

    def group_ranks(self, name: str) -> list[int]:
        """The global ranks of this rank's group along `name`."""
        return [self.rank_at({**self.coordinates, name: index}) for index in range(self[name].size)]


# ---- the experts' own grid (Megatron-Core's "parallel folding") ---- Within a stage the TP x DP ranks are refolded as
# ETP x EP x EDP, ETP fastest; the expert data-parallel group holds the ranks with the same experts, over which their
# gradients are reduced and ZeRO partitions their states.

EXPERT_MESH_DIM_NAMES = ("pp", "edp", "ep", "etp")  # outermost first


def expert_mesh_sizes(sizes: Mapping[str, int], expert_model_parallel_size: int,
                      expert_tensor_parallel_size: int) -> dict[str, int]:
    """The expert grid's sizes over the dense mesh `sizes`; ValueError naming the flags when EP x ETP does not divide
    the ranks of a stage (CP folds into the experts' DP)."""
    ep, etp = expert_model_parallel_size, expert_tensor_parallel_size
    if ep < 1:
        raise ValueError(f"--expert-model-parallel-size must be at least 1, got {ep}")
    if etp < 1:
        raise ValueError(f"--expert-tensor-parallel-size must be at least 1, got {etp}")
    stage_ranks = sizes.get("dp", 1) * sizes.get("cp", 1) * sizes.get("tp", 1)
    if stage_ranks % (ep * etp):
        raise ValueError(f"--expert-model-parallel-size {ep} x --expert-tensor-parallel-size {etp} does not divide "
                         f"the {stage_ranks} ranks of a pipeline stage (data-parallel x tensor-parallel size): the "
                         f"experts' grid folds the same ranks; pick sizes whose product divides {stage_ranks}")
    return {"pp": sizes.get("pp", 1), "edp": stage_ranks // (ep * etp), "ep": ep, "etp": etp}


def expert_coordinates(rank: int, expert_sizes: Mapping[str, int]) -> dict[str, int]:
    """Rank `rank`'s coordinates on the expert grid."""
    coordinates, rest = {}, rank
    for name in reversed(EXPERT_MESH_DIM_NAMES):  # the innermost dimension varies fastest
        rest, coordinates[name] = divmod(rest, expert_sizes[name])
    return coordinates


def expert_rank_at(coordinates: Mapping[str, int], expert_sizes: Mapping[str, int]) -> int:
    rank = 0
    for name in EXPERT_MESH_DIM_NAMES:
        rank = rank * expert_sizes[name] + coordinates[name]
    return rank


def expert_groups(expert_sizes: Mapping[str, int], names: tuple[str, ...]) -> list[list[int]]:
    """Every group spanning the expert dimensions `names`, in one order every rank agrees on, the last of `names`
    fastest."""
    others = [name for name in EXPERT_MESH_DIM_NAMES if name not in names]
    spanned = [name for name in EXPERT_MESH_DIM_NAMES if name in names]
    groups = []
    for fixed in _product({name: expert_sizes[name] for name in others}):
        groups.append([expert_rank_at({**fixed, **varied}, expert_sizes)
                       for varied in _product({name: expert_sizes[name] for name in spanned})])
    return groups


def _product(sizes: Mapping[str, int]) -> list[dict[str, int]]:
    points: list[dict[str, int]] = [{}]
    for name, size in sizes.items():
        points = [{**point, name: index} for point in points for index in range(size)]
    return points


# ---- hierarchical context parallelism (--hierarchical-context-parallel-sizes) ----

def hierarchical_groups(ranks: Sequence[int], sizes: Sequence[int]) -> list[list[list[int]]]:
    """Megatron-Core's create_hierarchical_groups over one group's `ranks`: per level k, the groups of sizes[k] ranks.
    CP 4 at (2, 2): level 0 {0,1} {2,3}, level 1 {0,2} {1,3}."""
    if math.prod(sizes) != len(ranks):
        raise ValueError(f"hierarchical sizes {list(sizes)} multiply to {math.prod(sizes)}, not the {len(ranks)} ranks")
    levels = []
    for level, size in enumerate(sizes):
        inner, outer = math.prod(sizes[:level]), math.prod(sizes[level + 1:])
        levels.append([[ranks[(block * size + member) * inner + offset] for member in range(size)]
                       for block in range(outer) for offset in range(inner)])
    return levels
