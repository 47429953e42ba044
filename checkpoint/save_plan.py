"""The save plan: what each rank writes, by the one rule over the sharding records (told in parallel/sharding.py).

The optimizer's state of a slice is replicated where its weights are, except that ZeRO (stage 1 and above)
partitions it over the data-parallel dimensions: there the partition's copies are the optimizer instances'
(Megatron-LM's --num-distributed-optimizer-instances), of which the first writes. A rank's partition file holds
its fragments the rule names (the fragment table) and their records, stored as the span of the partition from
the first named fragment to the last, a view of the live tensors: elements inside the span that it does not
name (a whole norm's copy on TP ranks above 0) are carried unnamed and never read, which costs a few bytes where
copying the named ones out would cost a partition-sized copy at every save.

What this rank writes comes out as `StagedFile`s (checkpoint/writer.py), lazily, one file at a time: the model
file of its dense slices (model_tp.. as Megatron names it), its experts' file (_ep...), its optimizer partition,
its RNG states.
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
    """The rule (module docstring)."""
    return all(at[dimension] == 0 for dimension in replicated_over)


def state_replicas(record: ShardingRecord, partitioned: bool) -> tuple[str, ...]:
    """The grid dimensions holding the same optimizer state of a slice: its weights', less the data-parallel
    ones ZeRO partitions the state over, where the optimizer instances hold the partition's copies instead."""
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
    """The partition's tensors from the first named fragment to the last (views) and the fragment table in the
    span's coordinates (module docstring)."""
    start = min(f.partition_offset for f in named)
    end = max(f.partition_offset + f.numel for f in named)
    return ({key: tensor[start:end] for key, tensor in shard.tensors.items()},
            [[f.name, f.param_offset, f.partition_offset - start, f.numel] for f in named])


def plan_rank_files(model: nn.Module, optimizer: CheckpointableOptimizer, shard: ShardedOptimizerState,
                    rng: Optional[TensorParallelRNG], state: ParallelState) -> Iterator[StagedFile]:
    """This rank's files, one at a time (the model's copies are made as the file is reached and dropped once it is
    written). Every rank of the job iterates this to the end: stage 3 gathers each chunk for the model files, a
    collective over the data-parallel group in which ranks that write nothing take part."""
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
    # Expert parallelism (zero/experts.py): the experts' weights on the first rank of their expert data-parallel
    # group, the others taking part in its gathers; an optimizer that keeps no experts apart answers None.
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

    # The random streams: a rank's own (a CP rank's are its DP rank's: the CP ranks hold the same streams).
    if state.context_parallel_rank == 0:
        random_tensors, random_header = rng_tensors(rng)
        name = rng_file(tp, state.data_parallel_rank, pp)
        yield StagedFile(name, random_tensors, random_header, ("rng_files", [tp, state.data_parallel_rank, name]))
