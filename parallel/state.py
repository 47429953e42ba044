"""The process grid every other module is handed: a `ParallelState` built once by `initialize()` and passed explicitly,
with the mesh's ranks and groups, Megatron's special groups, the experts' grid and the communicator."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallel.comm import Communicator, DryRunCommunicator, VirtualGroup
from parallel.launch_environment import LaunchEnvironment, read_launch_environment
from parallel.mesh import ParallelDims, expert_coordinates, expert_groups, expert_mesh_sizes, hierarchical_groups
from rendezvous.attempt_store import process_group_store

if TYPE_CHECKING:
    from parallel.config import ParallelismConfig


@dataclass(frozen=True)
class ParallelState:
    device: torch.device
    dims: ParallelDims = field(default_factory=ParallelDims.single_process)
    mesh: Optional[DeviceMesh] = field(default=None, compare=False, repr=False)
    comm: Communicator = field(default_factory=Communicator, compare=False, repr=False)
    # Megatron's embedding group: first and last stage, where a tied embedding's copies sum their gradient
    embedding_group: Optional[dist.ProcessGroup] = field(default=None, compare=False, repr=False)
    optimizer_instances: "OptimizerInstances" = field(default_factory=lambda: OptimizerInstances(), compare=False,
                                                      repr=False)
    # None is no expert parallelism (read it through `experts`)
    expert_grid: Optional["ExpertParallel"] = field(default=None, compare=False, repr=False)
    # Megatron's "dp-cp" group; None while CP is 1
    data_context_group: Optional[dist.ProcessGroup] = field(default=None, compare=False, repr=False)
    # the TP x CP x DP ranks of this stage, FP8's amax group; None while PP is 1
    stage_group: Optional[dist.ProcessGroup] = field(default=None, compare=False, repr=False)
    # a2a+p2p runs its all-to-all over level 0 and its ring over level 1
    hierarchical_context_sizes: tuple[int, ...] = ()
    hierarchical_context_groups: tuple = field(default=(), compare=False, repr=False)

    # a group is None while its size is 1
    @property
    def rank(self) -> int:
        return self.dims.rank

    @property
    def world_size(self) -> int:
        return self.dims.world_size

    @property
    def tensor_parallel_size(self) -> int:
        return self.dims["tp"].size

    @property
    def tensor_parallel_rank(self) -> int:
        return self.dims["tp"].coordinate

    @property
    def tensor_parallel_group(self) -> Optional[dist.ProcessGroup]:
        return self.dims["tp"].group

    @property
    def data_parallel_size(self) -> int:
        return self.dims["dp"].size

    @property
    def data_parallel_rank(self) -> int:
        return self.dims["dp"].coordinate

    @property
    def data_parallel_group(self) -> Optional[dist.ProcessGroup]:
        return self.dims["dp"].group

    @property
    def context_parallel_size(self) -> int:
        return self.dims["cp"].size

    @property
    def context_parallel_rank(self) -> int:
        return self.dims["cp"].coordinate

    @property
    def context_parallel_group(self) -> Optional[dist.ProcessGroup]:
        return self.dims["cp"].group

    # the ranks whose gradients are averaged: dp major, cp minor
    @property
    def data_context_parallel_size(self) -> int:
        return self.data_parallel_size * self.context_parallel_size

    @property
    def data_context_parallel_rank(self) -> int:
        return self.data_parallel_rank * self.context_parallel_size + self.context_parallel_rank

    @property
    def data_context_parallel_group(self) -> Optional[dist.ProcessGroup]:
        return self.data_context_group if self.context_parallel_size > 1 else self.data_parallel_group

    # ZeRO's partition: over DP x CP, or this rank's optimizer instance
    @property
    def partition_size(self) -> int:
        return self.optimizer_instances.shard_size or self.data_context_parallel_size

    @property
    def partition_rank(self) -> int:
        instances = self.optimizer_instances
        return self.data_parallel_rank % instances.shard_size if instances.count > 1 \
            else self.data_context_parallel_rank

    @property
    def partition_group(self) -> Optional[dist.ProcessGroup]:
        return self.optimizer_instances.shard_group if self.optimizer_instances.count > 1 \
            else self.data_context_parallel_group

    @property
    def partition_replica_group(self) -> Optional[dist.ProcessGroup]:
        return self.optimizer_instances.replica_group

    @property
    def partition_replica_index(self) -> int:
        instances = self.optimizer_instances
        return self.data_parallel_rank // instances.shard_size if instances.count > 1 else 0

    @property
    def pipeline_parallel_size(self) -> int:
        return self.dims["pp"].size

    @property
    def pipeline_parallel_rank(self) -> int:
        return self.dims["pp"].coordinate

    @property
    def pipeline_parallel_group(self) -> Optional[dist.ProcessGroup]:
        return self.dims["pp"].group

    @property
    def is_first_stage(self) -> bool:
        return self.pipeline_parallel_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pipeline_parallel_rank == self.pipeline_parallel_size - 1

    def stage_rank(self, stage: int) -> int:
        """The global rank of pipeline stage `stage` at this rank's (dp, tp)."""
        return self.dims.rank_at({**self.dims.coordinates, "pp": stage % self.pipeline_parallel_size})

    @property
    def experts(self) -> "ExpertParallel":
        return self.expert_grid if self.expert_grid is not None else _dense_experts(self)

    @property
    def is_first_rank(self) -> bool:
        return self.rank == 0

    def place(self) -> str:
        """Where this rank sits, for an error it alone met."""
        coordinates = ", ".join(f"{name} {rank}/{size}" for name, rank, size in (
            ("TP", self.tensor_parallel_rank, self.tensor_parallel_size),
            ("PP", self.pipeline_parallel_rank, self.pipeline_parallel_size),
            ("DP", self.data_parallel_rank, self.data_parallel_size),
            ("CP", self.context_parallel_rank, self.context_parallel_size),
            ("EP", self.experts.model_rank, self.experts.model_size)))
        return f"rank {self.rank} ({coordinates})"


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's place on the experts' grid: EP, ETP, EDP and ETP x EP groups (None for a group of one)."""
    model_size: int = 1
    model_rank: int = 0
    model_group: Optional[object] = None
    tensor_size: int = 1
    tensor_rank: int = 0
    tensor_group: Optional[object] = None
    data_size: int = 1
    data_rank: int = 0
    data_group: Optional[object] = None
    tensor_and_model_group: Optional[object] = None
    optimizer_instances: "OptimizerInstances" = field(default_factory=lambda: OptimizerInstances(), compare=False)

    @property
    def tensor_and_model_size(self) -> int:
        return self.tensor_size * self.model_size

    @property
    def tensor_and_model_rank(self) -> int:
        return self.model_rank * self.tensor_size + self.tensor_rank


def with_expert_parallel(state: "ParallelState", expert_model_parallel_size: int,
                         expert_tensor_parallel_size: Optional[int] = None) -> "ParallelState":
    """`state` with the experts' groups (a collective). Expert TP defaults to TP; with EP 1 the dense groups serve."""
    etp = state.tensor_parallel_size if expert_tensor_parallel_size is None else expert_tensor_parallel_size
    sizes = expert_mesh_sizes(state.dims.sizes, expert_model_parallel_size, etp)
    mine = expert_coordinates(state.rank, sizes)
    if sizes["ep"] == 1 and sizes["etp"] == state.tensor_parallel_size:
        return replace(state, expert_grid=None)
    groups = {}
    for key, names in (("ep", ("ep",)), ("etp", ("etp",)), ("edp", ("edp",)), ("etp_ep", ("ep", "etp"))):
        for ranks in expert_groups(sizes, names):
            if len(ranks) == 1:
                continue
            group = dist.new_group(ranks)
            if state.rank in ranks:
                groups[key] = group
    experts = ExpertParallel(sizes["ep"], mine["ep"], groups.get("ep"), sizes["etp"], mine["etp"], groups.get("etp"),
                             sizes["edp"], mine["edp"], groups.get("edp"), groups.get("etp_ep"))
    return replace(state, expert_grid=experts)


def _dense_experts(state: "ParallelState") -> ExpertParallel:
    return ExpertParallel(1, 0, None, state.tensor_parallel_size, state.tensor_parallel_rank,
                          state.tensor_parallel_group, state.data_parallel_size, state.data_parallel_rank,
                          state.data_parallel_group, state.tensor_parallel_group, state.optimizer_instances)


def _virtual_experts(state: "ParallelState", expert_model_parallel_size: int,
                     expert_tensor_parallel_size: Optional[int]) -> "ExpertParallel":
    etp = state.tensor_parallel_size if expert_tensor_parallel_size is None else expert_tensor_parallel_size
    sizes = expert_mesh_sizes(state.dims.sizes, expert_model_parallel_size, etp)
    mine = expert_coordinates(state.rank, sizes)

    def group(size: int, rank: int) -> Optional[VirtualGroup]:
        return VirtualGroup(size, rank) if size > 1 else None
    return ExpertParallel(sizes["ep"], mine["ep"], group(sizes["ep"], mine["ep"]), sizes["etp"], mine["etp"],
                          group(sizes["etp"], mine["etp"]), sizes["edp"], mine["edp"], group(sizes["edp"], mine["edp"]),
                          group(sizes["ep"] * sizes["etp"], mine["ep"] * sizes["etp"] + mine["etp"]))


@dataclass(frozen=True)
class OptimizerInstances:
    """--num-distributed-optimizer-instances N: the DP ranks in N contiguous blocks, the optimizer state sharded within
    each and replicated across them, so only the reduced shard crosses blocks."""
    count: int = 1
    shard_size: int = 0
    shard_group: Optional[object] = None
    replica_group: Optional[object] = None


def check_optimizer_instances(count: int, data_parallel_size: int, context_parallel_size: int = 1) -> None:
    """DP must divide by the instances, as a ValueError naming the flag."""
    if count > 1 and context_parallel_size > 1:
        raise ValueError(f"--num-distributed-optimizer-instances {count} with --context-parallel-size "
                         f"{context_parallel_size} is not implemented: use one optimizer instance with context "
                         f"parallelism")
    if count < 1 or data_parallel_size % count:
        raise ValueError(f"--num-distributed-optimizer-instances {count} must be at least 1 and divide the "
                         f"data-parallel size {data_parallel_size}; each instance shards the optimizer over an "
                         f"equal block of the data-parallel ranks")


def check_expert_optimizer_instances(count: int, expert_data_parallel_size: int) -> None:
    if count > 1 and expert_data_parallel_size % count:
        raise ValueError(f"--num-distributed-optimizer-instances {count} must divide the expert data-parallel size "
                         f"{expert_data_parallel_size} too (the experts' optimizer is cut into as many instances, as "
                         f"Megatron-LM asserts); use fewer instances, a smaller --expert-model-parallel-size, or more "
                         f"ranks")


def with_optimizer_instances(state: "ParallelState", count: int) -> "ParallelState":
    """`state` with its DP (and expert DP) group cut into `count` optimizer instances (a collective)."""
    if count == state.optimizer_instances.count:
        return state
    if state.expert_grid is not None:
        check_expert_optimizer_instances(count, state.expert_grid.data_size)
    state = replace(state, optimizer_instances=_optimizer_instance_groups(state.dims, count))
    if state.expert_grid is not None:
        state = replace(state, expert_grid=replace(state.expert_grid,
                                                   optimizer_instances=_expert_optimizer_instance_groups(state, count)))
    return state


def _expert_optimizer_instance_groups(state: "ParallelState", count: int) -> OptimizerInstances:
    experts = state.expert_grid
    if count == 1:
        return OptimizerInstances()
    shard_size = experts.data_size // count
    sizes = expert_mesh_sizes(state.dims.sizes, experts.model_size, experts.tensor_size)
    shard_group = replica_group = None
    for data_ranks in expert_groups(sizes, ("edp",)):
        blocks = [data_ranks[i * shard_size:(i + 1) * shard_size] for i in range(count)]
        for ranks in blocks + [list(copies) for copies in zip(*blocks)]:
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if state.rank in ranks:
                if ranks in blocks:
                    shard_group = group
                else:
                    replica_group = group
    return OptimizerInstances(count, shard_size, shard_group, replica_group)


def _optimizer_instance_groups(dims: ParallelDims, count: int) -> OptimizerInstances:
    check_optimizer_instances(count, dims["dp"].size)
    if count == 1:
        return OptimizerInstances()
    shard_size = dims["dp"].size // count
    shard_group = replica_group = None
    for pp in range(dims["pp"].size):
        for tp in range(dims["tp"].size):
            dp_ranks = [dims.rank_at({"pp": pp, "dp": dp, "cp": 0, "tp": tp}) for dp in range(dims["dp"].size)]
            blocks = [dp_ranks[i * shard_size:(i + 1) * shard_size] for i in range(count)]
            for ranks in blocks + [list(copies) for copies in zip(*blocks)]:
                group = dist.new_group(ranks) if len(ranks) > 1 else None
                if dims.rank in ranks:
                    if len(ranks) == shard_size and ranks in blocks:
                        shard_group = group
                    else:
                        replica_group = group
    return OptimizerInstances(count, shard_size, shard_group, replica_group)


def resolve_device(name: str, local_rank: Optional[int] = None) -> torch.device:
    """'auto' picks CUDA when present; an unindexed CUDA device becomes this process's GPU on its node."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device


def check_grid_divides(world_size: int, tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    """TP x PP must divide the launched processes; ValueError naming the flags."""
    if world_size % tensor_parallel_size != 0:
        raise ValueError(
            f"--tensor-model-parallel-size {tensor_parallel_size} does not divide the {world_size} "
            f"launched processes; launch a multiple of {tensor_parallel_size} processes or pick a TP size "
            f"that divides {world_size}")
    if world_size % (tensor_parallel_size * pipeline_parallel_size) != 0:
        raise ValueError(
            f"--tensor-model-parallel-size {tensor_parallel_size} x --pipeline-model-parallel-size "
            f"{pipeline_parallel_size} does not divide the {world_size} launched processes; launch a "
            f"multiple of {tensor_parallel_size * pipeline_parallel_size} processes or pick sizes whose product "
            f"divides {world_size}")


def initialize_grid(device_name: str, parallel: "ParallelismConfig", timeout_minutes: float,
                    optimizer_instances: int = 1, store: Optional[dist.Store] = None) -> ParallelState:
    return initialize(device_name, parallel.tensor_model_parallel_size, timeout_minutes, store=store,
                      pipeline_parallel_size=parallel.pipeline_model_parallel_size,
                      optimizer_instances=optimizer_instances, context_parallel_size=parallel.context_parallel_size,
                      expert_model_parallel_size=parallel.expert_model_parallel_size,
                      expert_tensor_parallel_size=parallel.expert_tensor_parallel_size,
                      hierarchical_context_parallel_sizes=parallel.hierarchical_context_parallel_sizes)


def initialize(device_name: str = "auto", tensor_parallel_size: int = 1, timeout_minutes: float = 10,
               gpus_per_node: Optional[int] = None, pipeline_parallel_size: int = 1,
               optimizer_instances: int = 1, context_parallel_size: int = 1, expert_model_parallel_size: int = 1,
               expert_tensor_parallel_size: Optional[int] = None, store: Optional[dist.Store] = None,
               hierarchical_context_parallel_sizes: Optional[Sequence[int]] = None) -> ParallelState:
    """Build the PP x DP x CP x TP grid and the experts' grid for this launch. `store`: the rendezvous store to build
    on, else torchrun's. The timeout turns a hung peer into an error."""
    if tensor_parallel_size < 1:
        raise ValueError(f"--tensor-model-parallel-size must be at least 1, got {tensor_parallel_size}")
    if pipeline_parallel_size < 1:
        raise ValueError(f"--pipeline-model-parallel-size must be at least 1, got {pipeline_parallel_size}")
    launch = read_launch_environment()
    check_grid_divides(launch.world_size, tensor_parallel_size, pipeline_parallel_size)
    if context_parallel_size < 1:
        raise ValueError(f"--context-parallel-size must be at least 1, got {context_parallel_size}")
    model_grid = tensor_parallel_size * pipeline_parallel_size * context_parallel_size
    if launch.world_size % model_grid != 0:
        raise ValueError(
            f"--tensor-model-parallel-size {tensor_parallel_size} x --pipeline-model-parallel-size "
            f"{pipeline_parallel_size} x --context-parallel-size {context_parallel_size} does not divide the "
            f"{launch.world_size} launched processes; launch a multiple of {model_grid} processes or pick sizes "
            f"whose product divides {launch.world_size}")
    check_optimizer_instances(optimizer_instances, launch.world_size // model_grid, context_parallel_size)
    hierarchical = check_hierarchical_sizes(hierarchical_context_parallel_sizes, context_parallel_size)
    expert_sizes = expert_mesh_sizes({"pp": pipeline_parallel_size, "tp": tensor_parallel_size,
                                      "cp": context_parallel_size, "dp": launch.world_size // model_grid},
                                     expert_model_parallel_size, expert_tensor_parallel_size or tensor_parallel_size)
    if expert_sizes["ep"] > 1 or expert_sizes["etp"] != tensor_parallel_size:
        check_expert_optimizer_instances(optimizer_instances, expert_sizes["edp"])
    device = resolve_device(device_name, launch.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if launch.world_size == 1:
        return with_expert_parallel(ParallelState(device=device), expert_model_parallel_size,
                                    expert_tensor_parallel_size)

    if launch.rank == 0:
        _warn_if_tensor_parallel_spans_nodes(tensor_parallel_size, device, launch, gpus_per_node)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(minutes=timeout_minutes)
    if store is None:
        store = process_group_store(launch.master_addr, launch.master_port, timeout, os.environ)
    if store is not None:
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size, timeout=timeout)
    else:
        host = f"[{launch.master_addr}]" if ":" in launch.master_addr else launch.master_addr  # IPv6
        dist.init_process_group(backend, init_method=f"tcp://{host}:{launch.master_port}", rank=launch.rank,
                                world_size=launch.world_size, timeout=timeout)
    data_parallel_size = launch.world_size // model_grid
    sizes = {"pp": pipeline_parallel_size, "dp": data_parallel_size, "cp": context_parallel_size,
             "tp": tensor_parallel_size}
    if pipeline_parallel_size == 1 and context_parallel_size == 1:
        mesh = init_device_mesh(device.type, (data_parallel_size, tensor_parallel_size), mesh_dim_names=("dp", "tp"))
    else:
        names = tuple(name for name in sizes if name in ("dp", "tp") or sizes[name] > 1)
        mesh = init_device_mesh(device.type, tuple(sizes[name] for name in names), mesh_dim_names=names)
    groups = {name: mesh.get_group(name) for name in sizes if sizes[name] > 1}
    dims = ParallelDims.of_rank(launch.rank, sizes, groups=groups)
    state = ParallelState(device=device, dims=dims, mesh=mesh, embedding_group=_embedding_group(dims),
                          data_context_group=_data_context_group(dims), stage_group=_stage_group(dims),
                          hierarchical_context_sizes=hierarchical,
                          hierarchical_context_groups=_hierarchical_context_groups(dims, hierarchical))
    state = with_expert_parallel(state, expert_model_parallel_size, expert_tensor_parallel_size)
    return with_optimizer_instances(state, optimizer_instances)


def _embedding_group(dims: ParallelDims) -> Optional[dist.ProcessGroup]:
    """Megatron's embedding group (first and last rank of each pipeline group)."""
    stages = dims["pp"].size
    if stages == 1:
        return None
    mine = None
    for dp in range(dims["dp"].size):
        for cp in range(dims["cp"].size):
            for tp in range(dims["tp"].size):
                ranks = [dims.rank_at({"pp": stage, "dp": dp, "cp": cp, "tp": tp}) for stage in (0, stages - 1)]
                group = dist.new_group(ranks)
                if dims.rank in ranks:
                    mine = group
    return mine


def _data_context_group(dims: ParallelDims) -> Optional[dist.ProcessGroup]:
    """Megatron's "dp-cp" group at this rank's (pp, tp); None while CP is 1."""
    if dims["cp"].size == 1:
        return None
    if dims["dp"].size == 1:
        return dims["cp"].group
    mine = None
    for pp in range(dims["pp"].size):
        for tp in range(dims["tp"].size):
            ranks = [dims.rank_at({"pp": pp, "dp": dp, "cp": cp, "tp": tp})
                     for dp in range(dims["dp"].size) for cp in range(dims["cp"].size)]
            group = dist.new_group(ranks)
            if dims.rank in ranks:
                mine = group
    return mine


def check_hierarchical_sizes(sizes: Optional[Sequence[int]], context_parallel_size: int) -> tuple[int, ...]:
    """--hierarchical-context-parallel-sizes as a tuple; ValueError unless they multiply to --context-parallel-size."""
    if not sizes:
        return ()
    if min(sizes) < 1 or math.prod(sizes) != context_parallel_size:
        raise ValueError(f"--hierarchical-context-parallel-sizes {' '.join(map(str, sizes))} must be sizes of at "
                         f"least 1 whose product is --context-parallel-size {context_parallel_size}")
    return tuple(sizes)


def _hierarchical_context_groups(dims: ParallelDims, sizes: tuple[int, ...]) -> tuple:
    if not sizes:
        return ()
    mine: list = [None] * len(sizes)
    for pp in range(dims["pp"].size):
        for dp in range(dims["dp"].size):
            for tp in range(dims["tp"].size):
                cp_ranks = [dims.rank_at({"pp": pp, "dp": dp, "cp": cp, "tp": tp}) for cp in range(dims["cp"].size)]
                for level, groups in enumerate(hierarchical_groups(cp_ranks, sizes)):
                    for ranks in groups if sizes[level] > 1 else ():
                        group = dist.new_group(ranks)
                        if dims.rank in ranks:
                            mine[level] = group
    return tuple(mine)


def _stage_group(dims: ParallelDims) -> Optional[dist.ProcessGroup]:
    """The DP x CP x TP ranks of this rank's stage; None while PP is 1."""
    stages = dims["pp"].size
    per_stage = dims.world_size // stages
    if stages == 1 or per_stage == 1:
        return None
    mine = None
    for stage in range(stages):
        ranks = list(range(stage * per_stage, (stage + 1) * per_stage))
        group = dist.new_group(ranks)
        if dims.rank in ranks:
            mine = group
    return mine


def _warn_if_tensor_parallel_spans_nodes(tensor_parallel_size: int, device: torch.device,
                                         launch: LaunchEnvironment, gpus_per_node: Optional[int]) -> None:
    per_node = gpus_per_node or launch.local_world_size
    if per_node is None and device.type == "cuda":
        per_node = torch.cuda.device_count()
    if per_node and tensor_parallel_size > per_node:
        warnings.warn(
            f"--tensor-model-parallel-size {tensor_parallel_size} is larger than the {per_node} GPUs of a "
            "node, so TP groups span nodes. TP across nodes is slow (the ZeRO paper measured it): keep TP "
            "within a node and scale across nodes with data parallelism (ZeRO).", stacklevel=3)


def virtual_state(world_size: int, tensor_parallel_size: int = 1, rank: int = 0,
                  device: torch.device | str = "meta", pipeline_parallel_size: int = 1,
                  optimizer_instances: int = 1, context_parallel_size: int = 1, expert_model_parallel_size: int = 1,
                  expert_tensor_parallel_size: Optional[int] = None,
                  hierarchical_context_parallel_sizes: Optional[Sequence[int]] = None) -> ParallelState:
    """One rank of a grid that is not launched (the planner), with groups that are only sizes."""
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size != 0:
        raise ValueError(f"--tensor-model-parallel-size {tensor_parallel_size} does not divide --world-size "
                         f"{world_size}")
    if pipeline_parallel_size < 1 or world_size % (tensor_parallel_size * pipeline_parallel_size) != 0:
        raise ValueError(f"--pipeline-model-parallel-size {pipeline_parallel_size} x --tensor-model-parallel-size "
                         f"{tensor_parallel_size} does not divide --world-size {world_size}")
    model_grid = tensor_parallel_size * pipeline_parallel_size * context_parallel_size
    if context_parallel_size < 1 or world_size % model_grid != 0:
        raise ValueError(f"--context-parallel-size {context_parallel_size} x --pipeline-model-parallel-size "
                         f"{pipeline_parallel_size} x --tensor-model-parallel-size {tensor_parallel_size} does not "
                         f"divide --world-size {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    sizes = {"pp": pipeline_parallel_size, "dp": world_size // model_grid, "cp": context_parallel_size,
             "tp": tensor_parallel_size}
    dims = ParallelDims.of_rank(rank, sizes, groups={name: VirtualGroup(size) for name, size in sizes.items()})
    on_end_stage = dims["pp"].coordinate in (0, pipeline_parallel_size - 1)
    embedding_group = VirtualGroup(2) if pipeline_parallel_size > 1 and on_end_stage else None
    check_optimizer_instances(optimizer_instances, sizes["dp"], context_parallel_size)
    data_context = VirtualGroup(sizes["dp"] * context_parallel_size) if context_parallel_size > 1 else None
    instances = OptimizerInstances() if optimizer_instances == 1 else OptimizerInstances(
        optimizer_instances, sizes["dp"] // optimizer_instances, VirtualGroup(sizes["dp"] // optimizer_instances),
        VirtualGroup(optimizer_instances))
    hierarchical = check_hierarchical_sizes(hierarchical_context_parallel_sizes, context_parallel_size)
    levels = hierarchical_groups(dims.group_ranks("cp"), hierarchical) if hierarchical else []
    member = [next(group.index(rank) for group in groups if rank in group) for groups in levels]
    state = ParallelState(device=torch.device(device), dims=dims, comm=DryRunCommunicator(rank),
                          embedding_group=embedding_group, optimizer_instances=instances,
                          data_context_group=data_context, hierarchical_context_sizes=hierarchical,
                          hierarchical_context_groups=tuple(VirtualGroup(size, index) if size > 1 else None
                                                            for size, index in zip(hierarchical, member)))
    experts = _virtual_experts(state, expert_model_parallel_size, expert_tensor_parallel_size)
    if optimizer_instances > 1:
        check_expert_optimizer_instances(optimizer_instances, experts.data_size)
        edp_shard = experts.data_size // optimizer_instances
        experts = replace(experts, optimizer_instances=OptimizerInstances(
            optimizer_instances, edp_shard, VirtualGroup(edp_shard) if edp_shard > 1 else None,
            VirtualGroup(optimizer_instances)))
    return replace(state, expert_grid=experts)


def destroy(state: ParallelState) -> None:
    if state.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
