"""Save and load a training run's sharded state (the format is in `checkpoint/format.py`).

Saving: every rank writes its own files into `iter_NNNNNNN.partial/`; the ranks then agree that all of
them succeeded, and only then does rank 0 write `metadata.json`, rename the directory into place and
replace `latest`. A rank that fails (disk full, permissions) makes every rank raise
`CheckpointError`, and a process killed midway leaves only a `.partial` directory that nothing reads:
either way the previous checkpoint and `latest` are untouched.

Loading goes through `checkpoint/global_load.py`: the checkpoint is opened as whole tensors by name
(`checkpoint/zero_gpt_source.py`) and each rank reads the global regions its parameters' sharding records and its
optimizer partition's fragments say it owns, so a checkpoint written at any layout (TP, PP, EP, expert TP, DP,
ZeRO stage, offload) resumes at any other.

The optimizer is read and restored only through the interface of zero/optimizer_state.py (its
`model_state_dict`, `sharded_state_dict` and `load_sharded_state_dict`): how it lays out its state is
its own affair, and the files record only what that interface says.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from checkpoint.format import (
    FORMAT_VERSION,
    METADATA_FILE,
    STAGING_SUFFIX,
    TOKENIZER_DIR,
    CheckpointError,
    commit,
    expert_model_file,
    iteration_dir_name,
    metadata_text,
    model_file,
    optimizer_file,
    prune,
    read_metadata,
    remove_stale_saves,
    resolve_checkpoint,
    rng_file,
    save_tensors,
    write_text_atomic,
)
from checkpoint.global_load import ResumePoint, load_from_source, parameter_records
from checkpoint.integrity import hash_files, verify_checkpoint
from checkpoint.lineage import RunIdentity
from checkpoint.pipeline_stages import gather_stage_tables, stored_names, whole_table
from checkpoint.random_states import rng_tensors
from checkpoint.router_state import expert_biases
from checkpoint.zero_gpt_source import RECORDS, ZeroGptSource
from data.identity import data_identity
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer, ShardedOptimizerState

__all__ = ["ResumePoint", "load_checkpoint", "save_checkpoint", "prune_checkpoints", "verify_for_job"]


def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(param) -> its name (a tied parameter under its first name)."""
    return {id(param): name for name, param in model.named_parameters()}


def parameter_table(model: nn.Module) -> dict[str, dict]:
    """Every parameter's whole shape and the dimension its slices are cut along (None: whole on every rank that
    holds it), from its sharding record (parallel/sharding.py)."""
    return {name: {"shape": list(record.global_shape), "tensor_parallel_dim": record.split_dim}
            for name, (_, record) in parameter_records(model).items()}


# ---- saving -----------------------------------------------------------------------------------

def _stage_rank(state: ParallelState) -> Optional[int]:
    """The pipeline rank in this rank's file names; None without stages (the one-stage names)."""
    return state.pipeline_parallel_rank if state.pipeline_parallel_size > 1 else None


def _owned_partition(shard: ShardedOptimizerState, stored: set[str]
                     ) -> tuple[dict[str, torch.Tensor], list[list]]:
    """The partition tensors this rank's optimizer file holds and their fragment table
    ([name, param_offset, partition_offset, numel] each). Where the optimizer names only some of its
    fragments (`owned`: with expert parallelism a part replicated over its data-parallel group is named by
    that group's first rank), only the span of those is written (a view, no copy; alignment padding inside
    it comes along), so every element is written once over the checkpoint; otherwise the whole partition
    (a fragment left out, the tied copy, keeps its elements there, unnamed)."""
    if shard.owned is None:
        return (dict(shard.tensors),  # master, exp_avg, exp_avg_sq (and AdEMAMix's exp_avg_slow)
                [list(fragment) for fragment in shard.fragments if fragment.name in stored])
    kept = [f for f in shard.owned if f.name in stored]
    start = min((f.partition_offset for f in kept), default=0)
    end = max((f.partition_offset + f.numel for f in kept), default=0)
    owned = set(shard.owned)
    if any(f not in owned and f.partition_offset < end and f.partition_offset + f.numel > start
           for f in shard.fragments):  # an element of another's inside the span: copy the owned pieces out
        pieces, fragments, position = [], [], 0
        for f in sorted(kept, key=lambda f: f.partition_offset):
            pieces.append((f.partition_offset, f.numel))
            fragments.append([f.name, f.param_offset, position, f.numel])
            position += f.numel
        return ({key: torch.cat([shard.tensors[key][o:o + n] for o, n in pieces]) for key in shard.tensors},
                fragments)
    return ({key: tensor[start:end] for key, tensor in shard.tensors.items()},
            [[f.name, f.param_offset, f.partition_offset - start, f.numel] for f in kept])


def _write_rank_files(staging: Path, model: nn.Module, optimizer: CheckpointableOptimizer,
                      shard: ShardedOptimizerState, rng: Optional[TensorParallelRNG], state: ParallelState,
                      tokenizer, stored: set[str]) -> tuple[dict[str, int], list[list]]:
    """This rank's files; returns {file name: bytes} and the expert model files it wrote ([tp, ep, file,
    [names]] each). Stage 3 gathers each chunk for the model file, which every DP rank of the TP group must
    take part in. Only the `stored` names are written (with pipeline stages, the tied embedding's second copy
    is the first stage's to store)."""
    tp, dp, pp = state.tensor_parallel_rank, state.data_parallel_rank, _stage_rank(state)
    written: dict[str, int] = {}
    experts_written: list[list] = []
    # With context parallelism the CP ranks of a DP rank hold the same weights and streams: CP rank 0 writes them
    # (the optimizer partition is cut over DP x CP: every partition rank writes its own).
    writer = dp == 0 and state.context_parallel_rank == 0

    weights = optimizer.model_state_dict(model, keep=writer)
    if writer:
        weights = {name: tensor for name, tensor in weights.items() if name in stored}
        written[model_file(tp, pp)] = save_tensors(staging / model_file(tp, pp), weights)
    del weights
    # Expert parallelism (zero/experts.py, the interface's optional call): each expert-parallel rank's experts,
    # from their owner only; no rank holds another rank's experts.
    own_experts = getattr(optimizer, "expert_model_state_dict", None)
    mine = own_experts(model) if own_experts is not None else None
    if mine is not None:
        ep, weights = mine
        weights = {name: tensor for name, tensor in weights.items() if name in stored}
        name = expert_model_file(tp, ep, pp)
        written[name] = save_tensors(staging / name, weights)
        experts_written.append([tp, ep, name, sorted(weights)])
    del mine

    # A replicated partition (stage 0) is written once, by DP rank 0; a partition held by several optimizer
    # instances (parallel/state.py) by the first instance's copy, under its partition rank.
    if writer if shard.replicated else state.partition_replica_index == 0:
        tensors, fragments = _owned_partition(shard, stored)
        name = optimizer_file(tp, 0 if shard.replicated else state.partition_rank, pp)
        # each named parameter's sharding record: where this rank's slice sits in the whole tensor
        records = parameter_records(model)
        written[name] = save_tensors(staging / name, tensors, {
            "fragments": fragments,
            RECORDS: {param: [list(records[param][1].global_offset), list(records[param][1].local_shape)]
                      for param in dict.fromkeys(fragment[0] for fragment in fragments)}})
        del tensors

    if state.context_parallel_rank == 0:
        random_tensors, rng_metadata = rng_tensors(rng)
        written[rng_file(tp, dp, pp)] = save_tensors(staging / rng_file(tp, dp, pp), random_tensors, rng_metadata)

    if state.is_first_rank and tokenizer is not None:
        tokenizer.save(str(staging / TOKENIZER_DIR))
    return written, experts_written


def save_checkpoint(save_dir: str | Path, iteration: int, consumed_samples: int, model: nn.Module,
                    optimizer: CheckpointableOptimizer, rng: Optional[TensorParallelRNG], config,
                    state: ParallelState, tokenizer=None, lr: Optional[float] = None,
                    identity: Optional[RunIdentity] = None, schedule_samples: Optional[int] = None) -> Path:
    """Write iteration `iteration`'s checkpoint and point `latest` at it; every rank calls this.
    `identity` (the run's lineage and launch) goes into its metadata: --keep-last prunes only its lineage.
    Raises `CheckpointError` on every rank if any rank failed, leaving the previous checkpoint."""
    save_dir = Path(save_dir)
    final = save_dir / iteration_dir_name(iteration)
    staging = final.with_name(final.name + STAGING_SUFFIX)
    started = time.perf_counter()
    if state.is_first_rank:  # a large save takes minutes; say when it starts, not only when it ends
        print(f" saving checkpoint at iteration {iteration} to {final}", flush=True)

    shard = optimizer.sharded_state_dict(model)
    _raise_if_any_failed(state, non_finite_training_state(shard), iteration, staging)
    stage_tables = gather_stage_tables(parameter_table(model), state)
    stage_names = stored_names(stage_tables)
    error = None
    if state.is_first_rank:
        try:
            save_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_saves(save_dir)
            staging.mkdir()
        except OSError as failure:
            error = f"cannot create {staging}: {failure}"
    _raise_if_any_failed(state, error, iteration, staging)

    written, experts_written, hashes, error = {}, [], {}, None
    try:
        written, experts_written = _write_rank_files(staging, model, optimizer, shard, rng, state, tokenizer,
                                    set(stage_names[state.pipeline_parallel_rank]))
        hashes = hash_files(staging, written)  # each rank hashes its own files, still in the page cache
    except Exception as failure:  # noqa: BLE001 - disk full, permissions, safetensors' own errors: any
        # failure must reach the other ranks, which would otherwise wait for this one forever
        error = f"{type(failure).__name__}: {failure}"
    # a save is complete only when every rank of every stage has its files in: one verdict over the world
    # the routers' expert bias (checkpoint/router_state.py): the same on every rank of a stage, sent by its first
    biases = expert_biases(model) if state.data_parallel_rank == 0 and state.tensor_parallel_rank == 0 \
        and state.context_parallel_rank == 0 else {}
    outcomes = state.comm.all_gather_object((error, written, hashes, experts_written, biases))
    _raise_if_any_failed(state, next((f"rank {rank}: {e}" for rank, (e, *_) in enumerate(outcomes) if e), None),
                         iteration, staging)

    error = None
    if state.is_first_rank:
        files = {name: size for _, rank_files, *_ in outcomes for name, size in rank_files.items()}
        metadata = _metadata(iteration, consumed_samples, stage_tables, shard, config, state, files, lr,
                             tokenizer is not None, [entry for *_, entries, _ in outcomes for entry in entries])
        metadata["lr_schedule_samples"] = consumed_samples if schedule_samples is None else schedule_samples
        metadata.update(identity.fields() if identity is not None else {})
        saved_biases = {name: values for *_, rank_biases in outcomes for name, values in rank_biases.items()}
        if saved_biases:
            metadata["expert_bias"] = saved_biases
        metadata["file_hashes"] = {name: digest for _, _, rank_hashes, *_ in outcomes
                                   for name, digest in rank_hashes.items()}
        try:
            write_text_atomic(staging / METADATA_FILE, metadata_text(metadata))
            commit(staging, final, save_dir)
        except Exception as failure:  # noqa: BLE001 - as above: the other ranks wait for the verdict
            error = f"cannot commit {staging}: {failure}"
    _raise_if_any_failed(state, error, iteration, staging)
    if state.is_first_rank:
        size = sum(size for _, rank_files, *_ in outcomes for size in rank_files.values())
        print(f" saved checkpoint {final} ({size / 2**20:.1f} MiB in {time.perf_counter() - started:.1f} s)",
              flush=True)
    return final


NON_FINITE_CHECK_CHUNK = 1 << 24  # elements per check: the bool and cast temporaries stay a few MiB


def count_non_finite(tensor: torch.Tensor, as_dtype: Optional[torch.dtype] = None) -> int:
    """NaN/inf elements of `tensor`, or of its cast to `as_dtype`, in bounded chunks."""
    flat = tensor.detach().reshape(-1)
    bad = 0
    for start in range(0, flat.numel(), NON_FINITE_CHECK_CHUNK):
        chunk = flat[start:start + NON_FINITE_CHECK_CHUNK]
        bad += int((~torch.isfinite(chunk if as_dtype is None else chunk.to(as_dtype))).sum())
    return bad


def non_finite_training_state(shard: ShardedOptimizerState) -> Optional[str]:
    """Why this rank's state must not be saved (NaN or inf in it), or None. A checkpoint of a
    diverged run would become `latest` and every restart would load the divergence. The master is
    also checked in the 16-bit training dtype: a master of 1e9 is finite in fp32 and inf in fp16,
    and the 16-bit parameters (the master cast, saved as the model file) are what a restart
    computes its first forward with. Only this rank's own partition is read."""
    for key in shard.tensors:
        bad = count_non_finite(shard.tensors[key])
        if bad:
            return (f"the fp32 {key} holds {bad} non-finite values (NaN or inf); the run diverged, so nothing "
                    f"is saved")
    dtype = shard.param_dtype
    if dtype != torch.float32:
        bad = count_non_finite(shard.tensors["master"], as_dtype=dtype)
        if bad:
            return (f"{bad} master weights are beyond {str(dtype).replace('torch.', '')}'s range, so the parameters "
                    f"the model file would hold are inf; the run diverged, so nothing is saved")
    return None


def _raise_if_any_failed(state: ParallelState, error: Optional[str], iteration: int, staging: Path) -> None:
    errors = [e for e in state.comm.all_gather_object(error) if e]
    if errors:
        if state.is_first_rank:
            shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(f"saving iteration {iteration} failed ({errors[0]}); the previous checkpoint "
                              f"and 'latest' are untouched")


def _metadata(iteration: int, consumed_samples: int, stage_tables: list[dict], shard: ShardedOptimizerState, config,
              state: ParallelState, files: dict[str, int], lr: Optional[float], has_tokenizer: bool,
              expert_files: Optional[list[list]] = None) -> dict:
    tp_size, dp_size, pp_size = state.tensor_parallel_size, state.data_parallel_size, state.pipeline_parallel_size
    optimizer_dp_ranks = range(1) if shard.replicated else range(state.partition_size)
    stages = [stage if pp_size > 1 else None for stage in range(pp_size)]
    def stage_files(pp: Optional[int]) -> list[str]:
        return ([model_file(tp, pp) for tp in range(tp_size)]
                + [optimizer_file(tp, dp, pp) for tp in range(tp_size) for dp in optimizer_dp_ranks]
                + [rng_file(tp, dp, pp) for tp in range(tp_size) for dp in range(dp_size)])

    metadata = {
        "format_version": FORMAT_VERSION,
        "iteration": iteration,
        "consumed_samples": consumed_samples,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tensor_parallel_size": tp_size,
        "data_parallel_size": dp_size,
        "zero_stage": shard.zero_stage,
        "precision": config.training.precision,
        "adam_step": shard.adam_step,
        "lr": lr,
        "loss_scaler": {"type": shard.loss_scaler_type, "state": shard.loss_scaler_state},
        "parameters": whole_table(stage_tables),
        # every stage's files; pipeline_stages (below) says which stage wrote which
        "model_files": [[tp, model_file(tp, pp)] for pp in stages for tp in range(tp_size)],
        "optimizer_shards": [[tp, dp, optimizer_file(tp, dp, pp)] for pp in stages for tp in range(tp_size)
                             for dp in optimizer_dp_ranks],
        "rng_files": [[tp, dp, rng_file(tp, dp, pp)] for pp in stages for tp in range(tp_size) for dp in range(dp_size)],
        "tokenizer": TOKENIZER_DIR if has_tokenizer else None,
        "files": files,
        "config": config.to_dict(),
        # What --data-path reads, as content: a resume compares this, not the path as typed.
        "data_identity": data_identity(config.data.data_path),
    }
    if state.context_parallel_size > 1:  # the optimizer partitions are then DP x CP (parallel/state.py)
        metadata["context_parallel_size"] = state.context_parallel_size
    if expert_files:  # each expert-parallel rank's experts in their own file; the dense model files hold none
        metadata["expert_model_parallel_size"] = 1 + max(ep for _, ep, _, _ in expert_files)
        metadata["expert_model_files"] = sorted(expert_files, key=lambda entry: entry[2])
    if pp_size > 1:
        metadata["pipeline_parallel_size"] = pp_size
        stage_of = {name: stage for stage, names in enumerate(stored_names(stage_tables)) for name in names}
        metadata["pipeline_stages"] = [
            {"parameters": names, "files": stage_files(stage) + [file for _, _, file, held in expert_files or []
                                                                 if held and stage_of[held[0]] == stage]}
            for stage, names in enumerate(stored_names(stage_tables))]
    return metadata


def prune_checkpoints(save_dir: str | Path, keep_last: Optional[int], state: ParallelState, run_id: str) -> None:
    """Keep the newest `keep_last` checkpoints of the lineage `run_id` (rank 0 deletes; None keeps all)."""
    if keep_last and state.is_first_rank:
        for path in prune(Path(save_dir), keep_last, run_id):
            print(f" removed old checkpoint {path}", flush=True)


# ---- loading ----------------------------------------------------------------------------------

def load_checkpoint(path: str | Path, model: nn.Module, optimizer: CheckpointableOptimizer,
                    rng: Optional[TensorParallelRNG], state: ParallelState, *, load_optimizer: bool = True,
                    load_rng: bool = True, finetune: bool = False, verify: bool = True) -> ResumePoint:
    """Restore this rank's state from a checkpoint of ours saved at any layout (checkpoint/global_load.py over
    checkpoint/zero_gpt_source.py): the fp32 master weights, with `load_optimizer` the optimizer's moments, step
    and loss scaler, with `load_rng` the random streams where the layout allows. `finetune` takes the weights
    only and starts at iteration 0. `verify` checks every file of the checkpoint first (`verify_for_job`); pass
    False only when that was just done."""
    iteration_dir = resolve_checkpoint(path)
    metadata = read_metadata(iteration_dir)
    if verify:
        verify_for_job(iteration_dir, metadata, state)
    with ZeroGptSource(iteration_dir, metadata) as source:
        return load_from_source(source, model, optimizer, rng, state, load_optimizer=load_optimizer,
                                load_rng=load_rng, finetune=finetune)


def verify_for_job(iteration_dir: Path, metadata: dict, state: ParallelState, check_content: bool = True) -> None:
    """Every file of the checkpoint verified (checkpoint/integrity.py), each by one rank; every
    rank raises the same CheckpointError if any file fails."""
    problem = verify_checkpoint(iteration_dir, metadata, check_content, state.rank, state.world_size)
    problems = [p for p in state.comm.all_gather_object(problem) if p]
    if problems:
        raise CheckpointError(problems[0])
