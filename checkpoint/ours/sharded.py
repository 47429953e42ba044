"""Save and load a training run's sharded state. A save is three steps on every rank (`begin_save`, `rank_files`,
`finish_save`) into `iter_N.partial/`, committed by rank 0 only once every rank succeeded, so a failure or a kill leaves
the previous checkpoint; a load reads the checkpoint as whole tensors through checkpoint/global_load.py.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from torch import nn

from checkpoint.finite_check import non_finite_training_state
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
from checkpoint.fp8_state import saved_fp8_histories
from checkpoint.global_load import ResumePoint, load_from_source, parameter_records
from checkpoint.integrity import verify_checkpoint
from checkpoint.lineage import RunIdentity
from checkpoint.ours.source import ZeroGptSource
from checkpoint.pipeline_stages import gather_stage_tables, whole_table
from checkpoint.rerun_machine_entry import ENTRY as RERUN_ENTRY
from checkpoint.rerun_machine_entry import saved_rerun_state
from checkpoint.router_state import expert_biases
from checkpoint.save_plan import plan_rank_files
from checkpoint.writer import StagedFile, write_files
from data.identity import data_identity
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer, ShardedOptimizerState

__all__ = ["ResumePoint", "load_checkpoint", "save_checkpoint", "prune_checkpoints", "verify_for_job"]


def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(param) -> its name (a tied parameter under its first name)."""
    return {id(param): name for name, param in model.named_parameters()}


def parameter_table(model: nn.Module) -> dict[str, dict]:
    """Every parameter's sharding record as metadata.json stores it (`tensor_parallel_dim` keeps its older name)."""
    return {name: {"shape": list(record.global_shape), "tensor_parallel_dim": record.split_dim,
                   "split_over": record.split_over, "replicated_over": list(record.replicated_over),
                   "real_rows": record.real_rows}
            for name, (_, record) in parameter_records(model).items()}



@dataclass
class SaveInProgress:
    """A save every rank has begun: where it goes and what its commit writes, as of the save's start (training changes
    the live state after)."""
    save_dir: Path
    iteration: int
    consumed_samples: int
    final: Path
    staging: Path
    started: float
    stage_tables: list[dict]
    shard: ShardedOptimizerState  # the live partition until rank_files is done; its scalars only after
    config: object
    lr: Optional[float]
    has_tokenizer: bool
    identity: Optional[RunIdentity]
    schedule_samples: Optional[int]
    biases: dict[str, list[float]]
    fp8_histories: dict
    total_bytes: int = 0        # every rank's files together, once finish_save has gathered them
    # The rerun state machine's pending re-run, {"common": ..., "rank": this rank's part}; None on every rank alike.
    rerun_state: Optional[dict] = None
    tokenizer_record: Optional[dict] = None


@dataclass
class RankOutcome:
    """How this rank's writes went: an error in words (None: all in), sizes, digests and listings."""
    error: Optional[str] = None
    sizes: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    listings: list = field(default_factory=list)


def begin_save(save_dir: str | Path, iteration: int, consumed_samples: int, model: nn.Module,
               optimizer: CheckpointableOptimizer, config, state: ParallelState, has_tokenizer: bool = False,
               lr: Optional[float] = None, identity: Optional[RunIdentity] = None,
               schedule_samples: Optional[int] = None, rerun_state: Optional[dict] = None,
               tokenizer_record: Optional[dict] = None) -> SaveInProgress:
    """The start of a save on every rank: the state must be finite, the stages' tables are gathered and the first rank
    makes `iter_N.partial`. Raises `CheckpointError` on every rank if any rank cannot go on."""
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
    biases = expert_biases(model) if state.data_parallel_rank == 0 and state.tensor_parallel_rank == 0 \
        and state.context_parallel_rank == 0 else {}
    histories = saved_fp8_histories(model, config, state)
    return SaveInProgress(save_dir, iteration, consumed_samples, final, staging, started, stage_tables,
                          dataclasses.replace(shard, loss_scaler_state=copy.deepcopy(shard.loss_scaler_state)),
                          config, lr, has_tokenizer, identity, schedule_samples, biases, histories,
                          rerun_state=copy.deepcopy(rerun_state), tokenizer_record=tokenizer_record)


def rank_files(progress: SaveInProgress, model: nn.Module, optimizer: CheckpointableOptimizer,
               rng: Optional[TensorParallelRNG], state: ParallelState, tokenizer=None) -> Iterator[StagedFile]:
    """This rank's files of the save plan, one at a time; every rank must run it to the end (stage 3 gathers for the
    model files). The optimizer file views the live partition: a background save copies it first."""
    yield from plan_rank_files(model, optimizer, progress.shard, rng, state)
    progress.shard = dataclasses.replace(progress.shard, tensors={})
    if state.is_first_rank and tokenizer is not None:
        tokenizer.save(str(progress.staging / TOKENIZER_DIR))


def write_rank_files(staging: Path, files: Iterator[StagedFile]) -> RankOutcome:
    """`files` through the writer into `staging`; after a failure the rest is still gathered, not written, so the other
    ranks' collectives complete."""
    outcome = RankOutcome()
    try:
        outcome.sizes, outcome.hashes, outcome.listings = write_files(staging, files)
    except Exception as failure:  # noqa: BLE001 - disk full, permissions, safetensors' own errors: any failure must
        # reach the other ranks, which would otherwise wait for this one forever
        outcome.error = f"{type(failure).__name__}: {failure}"
        try:
            for _ in files:
                pass
        except Exception:  # noqa: BLE001, S110 - the first error is the one reported
            pass
    return outcome


def finish_save(progress: SaveInProgress, outcome: RankOutcome, state: ParallelState) -> Path:
    """The end of a save on every rank: the ranks agree every file is in, then the first rank writes metadata.json,
    renames the directory and points `latest` at it. Raises `CheckpointError` on every rank if any failed."""
    iteration, staging, final = progress.iteration, progress.staging, progress.final
    outcomes = state.comm.all_gather_object((outcome.error, outcome.sizes, outcome.hashes, outcome.listings,
                                             progress.biases, state.pipeline_parallel_rank))
    _raise_if_any_failed(state, next((f"rank {rank}: {e}" for rank, (e, *_) in enumerate(outcomes) if e), None),
                         iteration, staging)
    rerun_parts = state.comm.all_gather_object(progress.rerun_state["rank"]) \
        if progress.rerun_state is not None else None

    error = None
    if state.is_first_rank:
        files = {name: size for _, rank_files, *_ in outcomes for name, size in rank_files.items()}
        metadata = _metadata(iteration, progress.consumed_samples, progress.stage_tables, progress.shard,
                             progress.config, state, files, progress.lr, progress.has_tokenizer,
                             [(stage, listing, holds) for *_, rank_listings, _, stage in outcomes
                              for listing, holds in rank_listings])
        metadata["lr_schedule_samples"] = progress.consumed_samples if progress.schedule_samples is None \
            else progress.schedule_samples
        metadata.update(progress.identity.metadata_fields() if progress.identity is not None else {})
        metadata.update(progress.tokenizer_record or {})
        saved_biases = {name: values for *_, rank_biases, _ in outcomes for name, values in rank_biases.items()}
        if saved_biases:
            metadata["expert_bias"] = saved_biases
        if progress.fp8_histories:
            metadata["fp8_amax_history"] = progress.fp8_histories
        if rerun_parts is not None:
            metadata[RERUN_ENTRY] = {**progress.rerun_state["common"], "ranks": rerun_parts}
        metadata["file_hashes"] = {name: digest for _, _, rank_hashes, *_ in outcomes
                                   for name, digest in rank_hashes.items()}
        try:
            write_text_atomic(staging / METADATA_FILE, metadata_text(metadata))
            commit(staging, final, progress.save_dir)
        except Exception as failure:  # noqa: BLE001 - as above: the other ranks wait for the verdict
            error = f"cannot commit {staging}: {failure}"
    _raise_if_any_failed(state, error, iteration, staging)
    progress.total_bytes = sum(size for _, rank_files, *_ in outcomes for size in rank_files.values())
    return final


def save_checkpoint(save_dir: str | Path, iteration: int, consumed_samples: int, model: nn.Module,
                    optimizer: CheckpointableOptimizer, rng: Optional[TensorParallelRNG], config,
                    state: ParallelState, tokenizer=None, lr: Optional[float] = None,
                    identity: Optional[RunIdentity] = None, schedule_samples: Optional[int] = None,
                    rerun_state: Optional[dict] = None, tokenizer_record: Optional[dict] = None) -> Path:
    """Write iteration `iteration`'s checkpoint and point `latest` at it; every rank calls this. `identity` goes into
    the metadata (--keep-last prunes only its lineage). Raises `CheckpointError` on every rank if any rank failed."""
    progress = begin_save(save_dir, iteration, consumed_samples, model, optimizer, config, state,
                          tokenizer is not None, lr, identity, schedule_samples, rerun_state, tokenizer_record)
    outcome = write_rank_files(progress.staging, rank_files(progress, model, optimizer, rng, state, tokenizer))
    final = finish_save(progress, outcome, state)
    if state.is_first_rank:
        print(f" saved checkpoint {final} ({progress.total_bytes / 2**20:.1f} MiB in "
              f"{time.perf_counter() - progress.started:.1f} s)", flush=True)
    return final


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
    """metadata.json: the run's state, the per-tensor record table, and the files every rank wrote."""
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
        "parameters": whole_table(stage_tables),
        **{kind: sorted(entries, key=lambda entry: entry[-1]) for kind, entries in by_list.items()
           if kind != "expert_model_files"},
        "tokenizer": TOKENIZER_DIR if has_tokenizer else None,
        "files": files,
        "config": config.to_dict(),
        # The training blend as content: a resume compares this, not the paths as typed.
        "data_identity": data_identity(config.data.sources().training_blend() or []),
    }
    if state.context_parallel_size > 1:  # the optimizer partitions are then DP x CP (parallel/state.py)
        metadata["context_parallel_size"] = state.context_parallel_size
    experts = by_list["expert_model_files"]
    if experts:
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
    """Keep the newest `keep_last` checkpoints of lineage `run_id` (rank 0 deletes; None keeps all)."""
    if keep_last and state.is_first_rank:
        for path in prune(Path(save_dir), keep_last, run_id):
            print(f" removed old checkpoint {path}", flush=True)


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: CheckpointableOptimizer,
                    rng: Optional[TensorParallelRNG], state: ParallelState, *, load_optimizer: bool = True,
                    load_rng: bool = True, finetune: bool = False, verify: bool = True) -> ResumePoint:
    """Restore this rank's state from a checkpoint of ours saved at any layout: the master weights, with
    `load_optimizer` the moments, step and loss scaler, with `load_rng` the random streams. `verify=False` only when
    files were just verified."""
    iteration_dir = resolve_checkpoint(path)
    metadata = read_metadata(iteration_dir)
    if verify:
        verify_for_job(iteration_dir, metadata, state)
    with ZeroGptSource(iteration_dir, metadata) as source:
        point = load_from_source(source, model, optimizer, rng, state, load_optimizer=load_optimizer,
                                 load_rng=load_rng, finetune=finetune)
    if finetune:  # Megatron-LM restores the rerun state machine only when resuming.
        return point
    rerun_state, layout_changed = saved_rerun_state(metadata, state)
    return dataclasses.replace(point, rerun_state=rerun_state, rerun_layout_changed=layout_changed)


def verify_for_job(iteration_dir: Path, metadata: dict, state: ParallelState, check_content: bool = True) -> None:
    """Every file verified, each by one rank; every rank raises the same CheckpointError if any fails."""
    problem = verify_checkpoint(iteration_dir, metadata, check_content, state.rank, state.world_size)
    problems = [p for p in state.comm.all_gather_object(problem) if p]
    if problems:
        raise CheckpointError(problems[0])
