"""The checks a resume makes before any work, on every rank, for whichever format: data settings, samples left, model,
schedule, and every file intact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from arguments.batch_schedule import BatchSchedule
from arguments.schedule import LearningRateSchedule, schedule_on_resume
from base.errors import CheckpointError
from checkpoint.agreement import agree, attempt
from checkpoint.resume_model import check_resume_model
from checkpoint.start_decision import check_resume_matches, check_samples_fit, continues_training
from checkpoint.upcycling import dense_model_config
from parallel.state import ParallelState

Log = Callable[[str], None]
# (folder, config) -> its metadata as our metadata.json's fields; (folder, metadata, state, read every byte) -> None,
# raising on every rank.
ReadMetadata = Callable[[Path, object], dict]
Verify = Callable[[Path, dict, ParallelState, bool], None]


def agreed_problem(state: ParallelState, problem: Optional[str]) -> None:
    """Raise on every rank the first rank's problem of a check each rank ran on its share."""
    problems = [p for p in state.comm.all_gather_object(problem) if p]
    if problems:
        raise CheckpointError(problems[0])


def check_resume(read_metadata: ReadMetadata, verify: Verify, config, state: ParallelState, iteration_dir: Path,
                 log: Log, batch: BatchSchedule) -> tuple[Optional[LearningRateSchedule], dict]:
    """The checks on a checkpoint whose metadata reads as ours; returns the schedule to keep, if any, and that metadata.
    """
    checkpoint = config.checkpoint
    metadata, error = attempt(lambda: read_metadata(iteration_dir, config))
    agree(state, error)
    schedule = None
    if continues_training(config):
        note, error = attempt(lambda: check_resume_matches(metadata, config, iteration_dir,
                                                           checkpoint.override_data_on_resume))
        agree(state, error)
        if note:
            log(note)
        agree(state, attempt(lambda: check_samples_fit(metadata, config, batch, iteration_dir))[1])
    if checkpoint.moe_use_upcycling:  # the checkpoint is the dense model the MoE one is made from
        dense = dense_model_config(config.model, checkpoint.moe_upcycling_granularity)
        agree(state, attempt(lambda: check_resume_model(metadata, dense, iteration_dir))[1])
    elif not checkpoint.finetune:
        agree(state, attempt(lambda: check_resume_model(metadata, config.model, iteration_dir))[1])
    if continues_training(config) and checkpoint.load_optim:  # as Megatron: only when it loads the scheduler
        outcome, error = attempt(lambda: schedule_on_resume(config.optimizer, config.training, config.model.seq_length,
                                                            batch, metadata.get("config") or {}, iteration_dir))
        agree(state, error)
        schedule, note = outcome
        if note:
            log(note)
    verify(iteration_dir, metadata, state, checkpoint.verify_checkpoint)
    return schedule, metadata
