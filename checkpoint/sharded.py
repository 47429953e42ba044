"""Save and load a training run's sharded state (the format is in `checkpoint/format.py`).

Saving: every rank writes its own files into `iter_NNNNNNN.partial/`; the ranks then agree that all of
them succeeded, and only then does rank 0 write `metadata.json`, rename the directory into place and
replace `latest`. A rank that fails (disk full, permissions) makes every rank raise
`CheckpointError`, and a process killed midway leaves only a `.partial` directory that nothing reads:
either way the previous checkpoint and `latest` are untouched.

Loading re-cuts the optimizer state for this run's layout: each rank asks the saved partitions of its
TP rank for exactly the parameter elements its own partition holds (`fill_partition`), so a
checkpoint written at any DP size and ZeRO stage resumes at any other. A different TP size is an
offline rewrite (`scripts/reshard_checkpoint.py`).

The optimizer is read and restored only through the interface of zero/optimizer_state.py (its
`model_state_dict`, `sharded_state_dict` and `load_sharded_state_dict`): how it lays out its state is
its own affair, and the files record only what that interface says.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from checkpoint.format import (
    FORMAT_VERSION,
    METADATA_FILE,
    STAGING_SUFFIX,
    TOKENIZER_DIR,
    CheckpointError,
    PartitionRequest,
    commit,
    expert_model_file,
    fill_partition,
    iteration_dir_name,
    metadata_text,
    model_file,
    open_tensors,
    optimizer_file,
    prune,
    read_metadata,
    remove_stale_saves,
    resolve_checkpoint,
    rng_file,
    save_tensors,
    write_text_atomic,
)
from checkpoint.integrity import hash_files, verify_checkpoint
from checkpoint.lineage import RunIdentity
from checkpoint.pipeline_stages import gather_stage_tables, stored_names, whole_table
from checkpoint.router_state import expert_biases, restore_expert_biases
from data.identity import data_identity
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer, ShardedOptimizerState


@dataclass(frozen=True)
class ResumePoint:
    iteration: int         # the last completed iteration; training continues with the next
    consumed_samples: int  # where the data sampler continues
    path: Path             # the iteration directory that was loaded
    # where the learning-rate schedule continues: the samples of the updates taken (fp16 skips excluded),
    # Megatron's OptimizerParamScheduler num_steps; a checkpoint from before it was saved: consumed_samples
    schedule_samples: Optional[int] = None


def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(param) -> its name (a tied parameter under its first name)."""
    return {id(param): name for name, param in model.named_parameters()}


def parameter_table(model: nn.Module, tensor_parallel_size: int) -> dict[str, dict]:
    """Every parameter's whole (all-TP-ranks) shape and the dimension TP splits it along."""
    table = {}
    for name, param in model.named_parameters():
        dim = getattr(param, "tensor_parallel_dim", None)
        shape = list(param.shape)
        if dim is not None:
            shape[dim] *= tensor_parallel_size
        table[name] = {"shape": shape, "tensor_parallel_dim": dim}
    return table


# ---- saving -----------------------------------------------------------------------------------

def _rng_tensors(rng: Optional[TensorParallelRNG]) -> tuple[dict[str, torch.Tensor], dict]:
    tensors: dict[str, torch.Tensor] = {}
    if rng is not None:
        for key, value in rng.get_states().items():
            if value is not None:
                tensors[f"torch_{key}"] = value
    else:
        tensors["torch_default_cpu"] = torch.get_rng_state()
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(keys.astype(np.int64))
    version, python_state, gauss = random.getstate()
    return tensors, {"numpy": [kind, int(position), int(has_gauss), float(cached_gaussian)],
                     "python": [version, list(python_state), gauss]}


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
        written[name] = save_tensors(staging / name, tensors, {"fragments": fragments})
        del tensors

    if state.context_parallel_rank == 0:
        rng_tensors, rng_metadata = _rng_tensors(rng)
        written[rng_file(tp, dp, pp)] = save_tensors(staging / rng_file(tp, dp, pp), rng_tensors, rng_metadata)

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
    stage_tables = gather_stage_tables(parameter_table(model, state.tensor_parallel_size), state)
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
        # What the training blend (--data-path, --train-data-path, ...) reads, as content: a resume compares this,
        # not the path as typed.
        "data_identity": data_identity(config.data.sources().training_blend() or []),
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

def check_compatible(metadata: dict, model: nn.Module, state: ParallelState, path: Path,
                     table: Optional[dict] = None) -> None:
    """The checkpoint must be of this model shape and (for now) this TP size. `table` is the whole
    model's parameter table (with pipeline stages, the union of every stage's); this rank's model's
    when not given. Any pipeline size loads: the names are the layers' global ones."""
    saved_tp = metadata["tensor_parallel_size"]
    if saved_tp != state.tensor_parallel_size:
        raise CheckpointError(
            f"{path} was saved with --tensor-model-parallel-size {saved_tp}, this run has "
            f"{state.tensor_parallel_size}; rewrite it first: python scripts/reshard_checkpoint.py {path} OUT "
            f"--tensor-model-parallel-size {state.tensor_parallel_size}")
    saved, ours = metadata["parameters"], table or parameter_table(model, state.tensor_parallel_size)
    problems = [f"{name}: missing from the checkpoint" for name in ours if name not in saved]
    problems += [f"{name}: in the checkpoint but not in this model" for name in saved if name not in ours]
    problems += [f"{name}: checkpoint shape {saved[name]['shape']}, model shape {ours[name]['shape']}"
                 for name in ours if name in saved and saved[name]["shape"] != ours[name]["shape"]]
    if problems:
        raise CheckpointError(f"{path} does not fit this model ({len(problems)} mismatched keys):\n  "
                              + "\n  ".join(problems))
    # The same whole shapes split another way over the TP ranks: the experts of an MoE model saved at another
    # --expert-tensor-parallel-size (gpt/moe/experts.py: split at ETP = TP, whole at 1); at TP 1 nothing is split
    split = [name for name in ours if saved[name].get("tensor_parallel_dim") != ours[name]["tensor_parallel_dim"]] \
        if saved_tp > 1 else []
    if split:
        raise CheckpointError(f"{path} splits {split[0]} (and {len(split) - 1} more parameters) over the tensor-parallel "
                              f"ranks differently from this run: its experts were saved at another "
                              f"--expert-tensor-parallel-size; resume at the expert tensor-parallel size it was "
                              f"saved with")


def saved_optimizer(metadata: dict) -> str:
    """The --optimizer a checkpoint's moments are of (checkpoints from before the setting: adam)."""
    return ((metadata.get("config") or {}).get("optimizer") or {}).get("optimizer", "adam")


def check_same_optimizer(metadata: dict, optimizer: str, path: Path) -> None:
    """Moments resume only into the optimizer that made them (Adam's two, AdEMAMix's three)."""
    saved = saved_optimizer(metadata)
    if saved != optimizer:
        raise CheckpointError(f"{path} holds --optimizer {saved}'s states, this run has --optimizer {optimizer}: "
                              f"resume with --optimizer {saved}, or pass --no-load-optim to start {optimizer}'s "
                              f"states fresh from its weights")


def saved_moment_dtypes(metadata: dict) -> dict[str, str]:
    """The stored dtype of each Adam moment in a checkpoint (its --exp-avg-dtype / --exp-avg-sq-dtype; fp32 for
    checkpoints from before the settings)."""
    section = (metadata.get("config") or {}).get("optimizer") or {}
    return {key: section.get(f"{key}_dtype", "fp32") for key in ("exp_avg", "exp_avg_sq")}


def note_moment_conversion(metadata: dict, shard: ShardedOptimizerState, path: Path) -> None:
    """Say so when a checkpoint's Adam moments are of another dtype than this run's: they are converted as read
    (fp32 to bf16 rounds to nearest even; bf16 to fp32 is exact). Megatron-LM converts too: its distributed
    optimizer saves the precision-aware optimizer's moments unscaled in fp32 (distrib_optimizer.py,
    _get_main_param_and_optimizer_states: get_unscaled_state) and stores a loaded one in the run's dtype
    (_set_main_param_and_optimizer_states: set_scaled_state)."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    ours = {key: names.get(shard.tensors[key].dtype, str(shard.tensors[key].dtype)) for key in ("exp_avg", "exp_avg_sq")}
    saved = saved_moment_dtypes(metadata)
    changed = [f"{key} {saved[key]} -> {ours[key]}" for key in ours if saved[key] != ours[key]]
    if changed:
        rounding = "; to bf16 rounds to nearest even" if any(ours[key] == "bf16" != saved[key] for key in ours) else ""
        print(f" note: {path} stores the Adam moments in other dtypes than this run's --exp-avg-dtype / "
              f"--exp-avg-sq-dtype: converted ({', '.join(changed)}{rounding})", flush=True)


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: CheckpointableOptimizer,
                    rng: Optional[TensorParallelRNG], state: ParallelState, *, load_optimizer: bool = True,
                    load_rng: bool = True, finetune: bool = False, verify: bool = True) -> ResumePoint:
    """Restore the fp32 master weights (and with `load_optimizer` the Adam moments, step and loss
    scaler; with `load_rng` the random streams) into this rank's partition, whatever DP size and
    stage saved them. `finetune` takes the weights only and starts at iteration 0. `verify` checks
    every file of the checkpoint first (`verify_for_job`); pass False only when that was just done."""
    iteration_dir = resolve_checkpoint(path)
    metadata = read_metadata(iteration_dir)
    if verify:
        verify_for_job(iteration_dir, metadata, state)
    # Every rank checks the whole model (the union of the stages' tables), so they all agree on a mismatch.
    table = whole_table(gather_stage_tables(parameter_table(model, state.tensor_parallel_size), state))
    check_compatible(metadata, model, state, iteration_dir, table)
    if finetune:
        load_optimizer = load_rng = False

    # Staged on the side and handed over only once every element is in: a checkpoint found incomplete
    # or corrupt midway leaves the optimizer as it was. Each fragment is looked up by name in the saved
    # partitions of this TP rank, whichever pipeline stage wrote them.
    shard = optimizer.sharded_state_dict(model)
    if load_optimizer:
        check_same_optimizer(metadata, shard.optimizer, iteration_dir)
    keys = tuple(shard.tensors) if load_optimizer else ("master",)
    # staged in the live dtypes: a moment saved in another dtype than this run's is converted as it is read
    staged = {key: torch.zeros(shard.tensors[key].shape, dtype=shard.tensors[key].dtype) for key in keys}
    if load_optimizer and state.is_first_rank:
        note_moment_conversion(metadata, shard, iteration_dir)
    fill_partition(iteration_dir, metadata, state.tensor_parallel_rank, PartitionRequest(shard.fragments), staged)
    warn_non_finite(iteration_dir, staged, state)
    scaler = metadata.get("loss_scaler") or {}
    scaler_applies = load_optimizer and scaler.get("type") == shard.loss_scaler_type
    optimizer.load_sharded_state_dict(staged, adam_step=metadata["adam_step"] if load_optimizer else None,
                                      loss_scaler_state=scaler["state"] if scaler_applies else None)
    if load_optimizer and not scaler_applies and state.is_first_rank:
        print(f" note: the checkpoint's loss scaler ({scaler.get('type')}) does not apply to this "
              f"run's precision; starting from the configured loss scale", flush=True)
    missing = restore_expert_biases(model, metadata.get("expert_bias"), state.device)
    if missing and state.is_first_rank:
        print(f" note: {iteration_dir} holds no expert bias for {missing[0]} (saved without "
              f"--moe-router-enable-expert-bias?); it starts at 0", flush=True)
    if load_rng:
        _restore_rng(iteration_dir, metadata, rng, state)

    if finetune:
        return ResumePoint(0, 0, iteration_dir, 0)
    return ResumePoint(metadata["iteration"], metadata["consumed_samples"], iteration_dir,
                       metadata.get("lr_schedule_samples", metadata["consumed_samples"]))


def verify_for_job(iteration_dir: Path, metadata: dict, state: ParallelState, check_content: bool = True) -> None:
    """Every file of the checkpoint verified (checkpoint/integrity.py), each by one rank; every
    rank raises the same CheckpointError if any file fails."""
    problem = verify_checkpoint(iteration_dir, metadata, check_content, state.rank, state.world_size)
    problems = [p for p in state.comm.all_gather_object(problem) if p]
    if problems:
        raise CheckpointError(problems[0])


def warn_non_finite(iteration_dir: Path, staged: dict[str, torch.Tensor], state: ParallelState) -> None:
    """Rank 0 says so when the loaded optimizer state holds NaN or inf on any rank: training from it
    diverges at once (and then stops, naming the iteration)."""
    counts = {key: int(tensor.numel() - torch.isfinite(tensor).sum()) for key, tensor in staged.items()}
    totals = {key: sum(rank_counts[key] for rank_counts in state.comm.all_gather_object(counts)) for key in counts}
    bad = {key: count for key, count in totals.items() if count}
    if bad and state.is_first_rank:
        listed = ", ".join(f"{count} in {key}" for key, count in bad.items())
        print(f" warning: {iteration_dir} holds non-finite values (NaN or inf): {listed}; training from it "
              f"will diverge", flush=True)


MT_WORDS = 624  # a Mersenne Twister's state: 624 32-bit words and a position in [0, 624]


def _is_count(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def random_states_problem(extra: dict, tensors: dict[str, torch.Tensor]) -> Optional[str]:
    """What is out of range in an RNG file's NumPy and Python states (the numbers `_rng_tensors` wrote),
    in words; None when each is what a Mersenne Twister holds. NumPy takes a position of -1 silently and
    a word beyond 32 bits with an OverflowError, so the ranges are checked here, by entry."""
    numpy_state, python_state = extra.get("numpy"), extra.get("python")
    if not isinstance(numpy_state, list) or len(numpy_state) != 4:
        return f"'numpy' must be [kind, position, has_gauss, cached_gaussian], got {numpy_state!r:.80}"
    kind, position, has_gauss, cached = numpy_state
    if kind != "MT19937":
        return f"NumPy's generator kind must be 'MT19937', got {kind!r:.40}"
    if not _is_count(position, 0, MT_WORDS):
        return f"NumPy's position must be an integer in [0, {MT_WORDS}], got {position!r:.40}"
    if not _is_count(has_gauss, 0, 1):
        return f"NumPy's has_gauss must be 0 or 1, got {has_gauss!r:.40}"
    if not isinstance(cached, (int, float)) or isinstance(cached, bool) or not math.isfinite(cached):
        return f"NumPy's cached Gaussian must be a finite number, got {cached!r:.40}"
    keys = tensors.get("numpy_keys")
    if keys is None or keys.shape != (MT_WORDS,) or bool(((keys < 0) | (keys >= 2**32)).any()):
        return f"numpy_keys must be {MT_WORDS} words of 32 bits"
    if not isinstance(python_state, list) or len(python_state) != 3:
        return f"'python' must be [version, state, gauss], got {python_state!r:.80}"
    version, words, gauss = python_state
    if version != 3 or not isinstance(words, list) or len(words) != MT_WORDS + 1:
        return f"Python's state must be version 3 with {MT_WORDS + 1} numbers"
    if not all(_is_count(word, 0, 2**32 - 1) for word in words[:-1]) or not _is_count(words[-1], 0, MT_WORDS):
        return f"Python's state must be {MT_WORDS} words of 32 bits and a position in [0, {MT_WORDS}]"
    if gauss is not None and (not isinstance(gauss, (int, float)) or isinstance(gauss, bool)
                              or not math.isfinite(gauss)):
        return f"Python's cached Gaussian must be a finite number or null, got {gauss!r:.40}"
    return None


def _restore_rng(iteration_dir: Path, metadata: dict, rng: Optional[TensorParallelRNG], state: ParallelState) -> None:
    """This rank's RNG states. A run with another DP size takes DP rank 0's of its TP rank: the
    streams do not depend on the DP rank (see parallel/random.py). With pipeline stages a rank takes
    its own stage's, or at another pipeline size the first stage's (each stage drew its own dropout
    masks; with dropout a resume at another size continues a stream, not the same masks)."""
    entries = metadata.get("rng_files", [])
    stages = metadata.get("pipeline_stages")
    if stages:
        stage = state.pipeline_parallel_rank if len(stages) == state.pipeline_parallel_size else 0
        entries = [entry for entry in entries if entry[2] in set(stages[stage]["files"])]
    files = {(tp, dp): name for tp, dp, name in entries}
    tp, dp = state.tensor_parallel_rank, state.data_parallel_rank
    name = files.get((tp, dp)) or files.get((tp, 0))
    if name is None:
        if state.is_first_rank:
            print(f" note: {iteration_dir} has no RNG states for TP rank {tp} (a resharded checkpoint?); "
                  "the random streams start from --seed", flush=True)
        return
    with open_tensors(iteration_dir, name, metadata) as reader:
        tensors = {key: reader.tensor(key) for key in reader.keys()}
        extra = reader.metadata()
    problem = random_states_problem(extra, tensors)
    if problem:
        raise CheckpointError(f"{iteration_dir / name}: corrupt random states ({problem})")
    try:
        kind, position, has_gauss, cached_gaussian = extra["numpy"]
        np.random.set_state((kind, tensors["numpy_keys"].numpy().astype(np.uint32), position, has_gauss,
                             cached_gaussian))
        version, python_state, gauss = extra["python"]
        random.setstate((version, tuple(python_state), gauss))
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise CheckpointError(f"{iteration_dir / name}: corrupt random states ({error})") from None
    if rng is None or "torch_tensor_parallel_cpu" not in tensors:
        torch.set_rng_state(tensors["torch_default_cpu"])
        if rng is not None and state.is_first_rank:
            print(f" note: {iteration_dir} has no tensor-parallel RNG stream (saved without one); "
                  "it starts from --seed", flush=True)
        return
    states = {key: tensors.get(f"torch_{key}") for key in
              ("default_cpu", "default_cuda", "tensor_parallel_cpu", "tensor_parallel_cuda")}
    try:
        rng.set_states(states)
    except ValueError as error:  # e.g. saved on CPU, resumed on CUDA
        if state.is_first_rank:
            print(f" note: RNG states not restored ({error}); the random streams start from --seed", flush=True)
