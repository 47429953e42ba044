"""Save and load a training run's sharded state (the format is in `checkpoint/format.py`).

Saving: every rank writes what the save plan gives it (checkpoint/save_plan.py: one rule over the sharding
records, the first replica of each slice writes it) through the writer (checkpoint/writer.py) into
`iter_NNNNNNN.partial/`; the ranks then agree that all of them succeeded, and only then does rank 0 write `metadata.json`, rename the directory into place and
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
    iteration_dir_name,
    metadata_text,
    prune,
    read_metadata,
    remove_stale_saves,
    resolve_checkpoint,
    write_text_atomic,
)
from checkpoint.global_load import ResumePoint, load_from_source, parameter_records
from checkpoint.integrity import verify_checkpoint
from checkpoint.lineage import RunIdentity
from checkpoint.pipeline_stages import gather_stage_tables, whole_table
from checkpoint.router_state import expert_biases
from checkpoint.save_plan import plan_rank_files
from checkpoint.writer import write_files
from checkpoint.zero_gpt_source import ZeroGptSource
from data.identity import data_identity
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer, ShardedOptimizerState

__all__ = ["ResumePoint", "load_checkpoint", "save_checkpoint", "prune_checkpoints", "verify_for_job"]


def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(param) -> its name (a tied parameter under its first name)."""
    return {id(param): name for name, param in model.named_parameters()}


def parameter_table(model: nn.Module) -> dict[str, dict]:
    """Every parameter's record as metadata.json stores it (parallel/sharding.py): the whole shape, the dimension
    its slices are cut along (None: whole) and over which grid dimension, the grid dimensions holding the same
    slice, and the real rows of a padded vocabulary. `tensor_parallel_dim` keeps the name checkpoints before the
    records gave the split dimension."""
    return {name: {"shape": list(record.global_shape), "tensor_parallel_dim": record.split_dim,
                   "split_over": record.split_over, "replicated_over": list(record.replicated_over),
                   "real_rows": record.real_rows}
            for name, (_, record) in parameter_records(model).items()}


# ---- saving -----------------------------------------------------------------------------------

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
    error = None
    if state.is_first_rank:
        try:
            save_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_saves(save_dir)
            staging.mkdir()
        except OSError as failure:
            error = f"cannot create {staging}: {failure}"
    _raise_if_any_failed(state, error, iteration, staging)

    written, hashes, listings, error = {}, {}, [], None
    try:
        written, hashes, listings = write_files(staging, plan_rank_files(model, optimizer, shard, rng, state))
        if state.is_first_rank and tokenizer is not None:
            tokenizer.save(str(staging / TOKENIZER_DIR))
    except Exception as failure:  # noqa: BLE001 - disk full, permissions, safetensors' own errors: any
        # failure must reach the other ranks, which would otherwise wait for this one forever
        error = f"{type(failure).__name__}: {failure}"
    # a save is complete only when every rank of every stage has its files in: one verdict over the world
    # the routers' expert bias (checkpoint/router_state.py): the same on every rank of a stage, sent by its first
    biases = expert_biases(model) if state.data_parallel_rank == 0 and state.tensor_parallel_rank == 0 \
        and state.context_parallel_rank == 0 else {}
    outcomes = state.comm.all_gather_object((error, written, hashes, listings, biases, state.pipeline_parallel_rank))
    _raise_if_any_failed(state, next((f"rank {rank}: {e}" for rank, (e, *_) in enumerate(outcomes) if e), None),
                         iteration, staging)

    error = None
    if state.is_first_rank:
        files = {name: size for _, rank_files, *_ in outcomes for name, size in rank_files.items()}
        metadata = _metadata(iteration, consumed_samples, stage_tables, shard, config, state, files, lr,
                             tokenizer is not None, [(stage, listing, holds) for *_, rank_listings, _, stage in outcomes
                                                     for listing, holds in rank_listings])
        metadata["lr_schedule_samples"] = consumed_samples if schedule_samples is None else schedule_samples
        metadata.update(identity.fields() if identity is not None else {})
        saved_biases = {name: values for *_, rank_biases, _ in outcomes for name, values in rank_biases.items()}
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
                        listings: list[tuple[int, tuple[str, list], tuple[str, ...]]]) -> dict:
    """metadata.json: the run's state, the per-tensor record table, and the files every rank wrote
    (`listings`: (pipeline stage, (list, entry), parameter names held) per file, as the save plan lists them)."""
    by_list: dict[str, list] = {"model_files": [], "optimizer_shards": [], "rng_files": [], "expert_model_files": []}
    for _, (kind, entry), _ in listings:
        by_list[kind].append(entry)
    metadata = {
        "format_version": FORMAT_VERSION,
        "iteration": iteration,
        "consumed_samples": consumed_samples,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tensor_parallel_size": state.tensor_parallel_size,
        "data_parallel_size": state.data_parallel_size,
        "zero_stage": shard.zero_stage,
        "precision": config.training.precision,
        "adam_step": shard.adam_step,
        "lr": lr,
        "loss_scaler": {"type": shard.loss_scaler_type, "state": shard.loss_scaler_state},
        # one record per tensor: its whole shape, how its slices are cut, which grid dimensions replicate them
        "parameters": whole_table(stage_tables),
        # every stage's files; pipeline_stages (below) says which stage wrote which
        **{kind: sorted(entries, key=lambda entry: entry[-1]) for kind, entries in by_list.items()
           if kind != "expert_model_files"},
        "tokenizer": TOKENIZER_DIR if has_tokenizer else None,
        "files": files,
        "config": config.to_dict(),
        # What --data-path reads, as content: a resume compares this, not the path as typed.
        "data_identity": data_identity(config.data.data_path),
    }
    if state.context_parallel_size > 1:  # the optimizer partitions are then DP x CP (parallel/state.py)
        metadata["context_parallel_size"] = state.context_parallel_size
    experts = by_list["expert_model_files"]
    if experts:  # each expert-parallel rank's experts in their own file; the dense model files hold none
        metadata["expert_model_parallel_size"] = state.experts.model_size
        metadata["expert_model_files"] = sorted(experts, key=lambda entry: entry[2])
    if state.pipeline_parallel_size > 1:
        metadata["pipeline_parallel_size"] = state.pipeline_parallel_size
        stages = [{"parameters": set(), "files": []} for _ in range(state.pipeline_parallel_size)]
        for stage, (kind, entry), holds in listings:
            stages[stage]["files"].append(entry[2] if kind == "expert_model_files" else entry[-1])
            stages[stage]["parameters"].update(holds)
        metadata["pipeline_stages"] = [{"parameters": [name for name in stage_tables[index] if name in
                                                       stage["parameters"]], "files": sorted(stage["files"])}
                                       for index, stage in enumerate(stages)]
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
