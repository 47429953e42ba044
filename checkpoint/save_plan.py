"""The save plan: what each rank writes, by one rule over the sharding records: a slice is written by its first replica,
with ZeRO's partitions replicated over the optimizer instances. A partition file stores the span of its named fragments
as views of the live tensors, so no partition-sized copy is made.
"""

from __future__ import annotations

from typing import Iterator, Optional

from torch import nn

from checkpoint.file_names import expert_model_file, model_file, optimizer_file, rng_file
from checkpoint.format import RECORDS
from checkpoint.global_load import parameter_records
from checkpoint.random_states import rng_tensors
from checkpoint.writer import StagedFile
from parallel.random import TensorParallelRNG
from parallel.sharding import ShardingRecord
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer, NamedFragment, ShardedOptimizerState

DATA_DIMENSIONS = ("dp", "cp", "edp")  # what ZeRO partitions a parameter's optimizer state over (stage >= 1)
OPTIMIZER_COPIES = "dp_replica"  # the optimizer instances holding the same partition


def coordinates(state: ParallelState) -> dict[str, int]:
    """This rank's coordinate on every grid dimension a record may name."""
    experts = state.experts
    return {"pp": state.pipeline_parallel_rank, "dp": state.data_parallel_rank, "cp": state.context_parallel_rank,
            "tp": state.tensor_parallel_rank, "edp": experts.data_rank, "etp": experts.tensor_rank,
            "ep": experts.model_rank, OPTIMIZER_COPIES: state.partition_replica_index}


def first_replica(replicated_over: tuple[str, ...], at: dict[str, int]) -> bool:
    """Whether this rank is the first on every dimension in `replicated_over`."""
    return all(at[dimension] == 0 for dimension in replicated_over)


def state_replicas(record: ShardingRecord, partitioned: bool) -> tuple[str, ...]:
    """The grid dimensions holding the same optimizer state of a slice: its weights', less those ZeRO partitions over.
    """
    if not partitioned:
        return record.replicated_over
    return tuple(d for d in record.replicated_over if d not in DATA_DIMENSIONS) + (OPTIMIZER_COPIES,)


def record_entries(records: dict[str, tuple[nn.Parameter, ShardingRecord]], names) -> dict[str, list]:
    """The records of the slices a file holds, as its header stores them: name -> [global offset, local shape]."""
    return {name: [list(records[name][1].global_offset), list(records[name][1].local_shape)] for name in names}


def stage_rank(state: ParallelState) -> Optional[int]:
    """The pipeline rank in this rank's file names; None without stages (the one-stage names)."""
    return state.pipeline_parallel_rank if state.pipeline_parallel_size > 1 else None


def named_fragments(shard: ShardedOptimizerState, records: dict, at: dict[str, int]) -> list[NamedFragment]:
    """The fragments of this rank's partition whose state it is the first replica of."""
    partitioned = shard.zero_stage >= 1
    return [f for f in shard.fragments if first_replica(state_replicas(records[f.name][1], partitioned), at)]


def partition_span(shard: ShardedOptimizerState, named: list[NamedFragment]) -> tuple[dict, list[list]]:
    """The partition's tensors from the first named fragment to the last (views), and the fragment table in span
    coordinates."""
    start = min(f.partition_offset for f in named)
    end = max(f.partition_offset + f.numel for f in named)
    return ({key: tensor[start:end] for key, tensor in shard.tensors.items()},
            [[f.name, f.param_offset, f.partition_offset - start, f.numel] for f in named])


def plan_rank_files(model: nn.Module, optimizer: CheckpointableOptimizer, shard: ShardedOptimizerState,
                    rng: Optional[TensorParallelRNG], state: ParallelState) -> Iterator[StagedFile]:
    """This rank's files, made lazily one at a time. Every rank iterates to the end: stage 3 gathers each chunk for the
    model files."""
    at, records = coordinates(state), parameter_records(model)
    tp, pp = state.tensor_parallel_rank, stage_rank(state)
    writes = {name: first_replica(record.replicated_over, at) for name, (_, record) in records.items()}

    dense_writer = any(writes[name] for name, (_, record) in records.items() if not record.is_expert)
    weights = optimizer.model_state_dict(model, keep=dense_writer)
    if dense_writer:
        kept = {name: tensor for name, tensor in weights.items() if writes[name]}
        name = model_file(tp, pp)
        yield StagedFile(name, kept, {RECORDS: record_entries(records, kept)}, ("model_files", [tp, name]),
                         tuple(kept))
    del weights
    # Experts' weights on the first rank of their expert data-parallel group; None where the optimizer keeps none apart.
    mine = optimizer.expert_model_state_dict(model)
    if mine is not None:
        ep, weights = mine
        kept = {name: tensor for name, tensor in weights.items() if writes[name]}
        experts = state.experts
        name = expert_model_file(tp, ep, pp, experts.tensor_rank if experts.tensor_size > state.tensor_parallel_size
                                 else None)
        yield StagedFile(name, kept, {RECORDS: record_entries(records, kept)},
                         ("expert_model_files", [tp, ep, name, sorted(kept)]), tuple(kept))
    del mine

    named = named_fragments(shard, records, at)
    if named:
        tensors, fragments = partition_span(shard, named)
        partition = 0 if shard.replicated else (state.partition_rank if shard.zero_stage >= 1
                                                else state.data_context_parallel_rank)
        name = optimizer_file(tp, partition, pp)
        yield StagedFile(name, tensors, {"fragments": fragments,
                                         RECORDS: record_entries(records, dict.fromkeys(f.name for f in named))},
                         ("optimizer_shards", [tp, partition, name]))

    # A CP rank's streams are its DP rank's.
    if state.context_parallel_rank == 0:
        random_tensors, random_header = rng_tensors(rng)
        name = rng_file(tp, state.data_parallel_rank, pp)
        yield StagedFile(name, random_tensors, random_header, ("rng_files", [tp, state.data_parallel_rank, name]))
