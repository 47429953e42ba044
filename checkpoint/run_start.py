"""Everything a training run claims and checks before any work, agreed by every rank.

`claim_run_start` finishes a first save killed before `latest` (checkpoint/unfinished_save.py),
decides fresh start or resume (checkpoint/start_decision.py), takes the locks of the save
directory and of the metrics file (checkpoint/save_directory.py, base/output_locks.py), proves every output path writable (checkpoint/output_paths.py), and verifies the
checkpoint to resume from: every file, its header and its hash (checkpoint/integrity.py). Rank 0
makes the decisions that touch shared files (the lock exists once); checks every rank must pass for
itself (its data cache directory) run everywhere. Each step ends in an agreement, so an error is the
same error on every rank, raised before any data or model work, and only rank 0 prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from arguments.batch_schedule import BatchSchedule
from arguments.config import sample_order
from arguments.schedule import LearningRateSchedule, schedule_on_resume
from base.errors import ALWAYS_EXPECTED, CheckpointError
from base.output_locks import MetricsFileLock, RunLock
from checkpoint.deepspeed_files import DeepSpeedCheckpoint, find_deepspeed_checkpoint
from checkpoint.deepspeed_resume import check_deepspeed_resume, refuse_save_into_deepspeed, verify_deepspeed
from checkpoint.format import read_metadata
from checkpoint.lineage import RunIdentity, identity_on_start, new_id
from checkpoint.megatron_common import is_megatron_checkpoint
from checkpoint.output_paths import prepare_output_directory, prepare_output_file, refuse_training_output_in_checkpoint
from checkpoint.resume_model import check_resume_model
from checkpoint.save_directory import SaveDirectoryLock
from checkpoint.sharded import verify_for_job
from checkpoint.start_decision import (
    StartDecision,
    check_resume_matches,
    check_samples_fit,
    check_save_directory,
    decide_start,
)
from checkpoint.unfinished_save import finish_unfinished_save, needs_finishing
from data import DataError
from parallel.state import ParallelState

EXPECTED = ALWAYS_EXPECTED + (DataError,)


@dataclass
class RunStart:
    resume_from: Optional[Path]  # the verified iteration directory to load; None: a fresh start
    locks: list[RunLock]  # held by rank 0 while the run writes: --save's and --metrics-file's
    # The checkpoint's learning-rate schedule, when --use-checkpoint-opt_param-scheduler keeps it: the
    # run's settings are resolved with it (training/run_settings.py), never patched afterwards.
    lr_schedule: Optional[LearningRateSchedule] = None
    # The run's lineage (the checkpoint's on a resume) and this launch, the same on every rank.
    identity: Optional[RunIdentity] = None

    def release(self) -> None:
        while self.locks:
            self.locks.pop().release()


def agree(state: ParallelState, error: Optional[BaseException]) -> None:
    """Raise on every rank the first error (in rank order) that any rank met."""
    errors = state.comm.all_gather_object(error)
    for rank, failure in enumerate(errors):
        if failure is not None:
            raise error if rank == state.rank else failure


def _attempt(action: Callable[[], object]) -> tuple[object, Optional[BaseException]]:
    try:
        return action(), None
    except EXPECTED as error:
        return None, error


def claim_run_start(config, state: ParallelState, cache_dir: Optional[str], log: Callable[[str], None],
                    batch: BatchSchedule) -> RunStart:
    """The checks and claims above, in order; raises the same expected error on every rank. `batch` is the
    run's batch schedule (computed once by the caller), which a resume compares its schedule with."""
    checkpoint = config.checkpoint
    locks: list[RunLock] = []

    def claim(lock: RunLock) -> None:
        lock.acquire()
        locks.append(lock)

    def first_rank() -> StartDecision:
        if checkpoint.save:
            refuse_training_output_in_checkpoint(checkpoint.save, "--save", save_directory=True)
        refuse_training_output_in_checkpoint(config.logging.metrics_file, "--metrics-file")
        for directory, flag in ((config.logging.tensorboard_dir, "--tensorboard-dir"), (cache_dir, "--data-cache-dir")):
            if directory:
                refuse_training_output_in_checkpoint(directory, flag)
        if needs_finishing(checkpoint.load, checkpoint.save):  # a requeued job whose first save was killed
            claim(SaveDirectoryLock(checkpoint.save, log=log))
            finish_unfinished_save(Path(checkpoint.save), log)
        decision = decide_start(checkpoint.load, checkpoint.save, checkpoint.universal_checkpoint)
        if checkpoint.save:
            refuse_save_into_deepspeed(checkpoint.save)
            prepare_output_directory(checkpoint.save, "--save")
            if not locks:
                claim(SaveDirectoryLock(checkpoint.save, log=log))
            check_save_directory(checkpoint.save, decision.resume_from, checkpoint.finetune, checkpoint.overwrite_save)
        prepare_output_file(config.logging.metrics_file, "--metrics-file")
        claim(MetricsFileLock(config.logging.metrics_file, log=log))
        if config.logging.tensorboard_dir:
            prepare_output_directory(config.logging.tensorboard_dir, "--tensorboard-dir")
        return decision

    started = RunStart(None, locks)
    decision, error = _attempt(first_rank) if state.is_first_rank else (None, None)
    try:
        agree(state, error)
        # Rank 0's ids: a fresh lineage (kept only if the checkpoint has none) and this launch's.
        decision, fresh_run_id, launch_id = state.comm.all_gather_object((decision, new_id(), new_id()))[0]
        if cache_dir is not None:  # every rank writes its own copy of the prepared corpus and caches
            agree(state, _attempt(lambda: prepare_output_directory(cache_dir, "--data-cache-dir"))[1])
        if decision.note:
            log(decision.note)
        metadata = None
        deepspeed = find_deepspeed_checkpoint(decision.resume_from, False) if decision.resume_from else None
        if deepspeed is not None:
            started.lr_schedule = check_deepspeed_start(config, state, deepspeed, log, batch)
        elif decision.resume_from is not None:
            started.lr_schedule, metadata = check_resume(config, state, decision.resume_from, log, batch)
        started.identity = identity_on_start(metadata, checkpoint.finetune, fresh_run_id, launch_id,
                                              sample_order(checkpoint.ckpt_format))
    except BaseException:
        started.release()
        raise
    started.resume_from = decision.resume_from
    return started


def check_deepspeed_start(config, state: ParallelState, checkpoint: DeepSpeedCheckpoint, log: Callable[[str], None],
                          batch: BatchSchedule) -> Optional[LearningRateSchedule]:
    """Every file of a DeepSpeed checkpoint verified by a share of the ranks, then its checks (checkpoint/
    deepspeed_resume.py) on the first rank; the checkpoint's schedule when it is kept."""
    problem = verify_deepspeed(checkpoint, state.rank, state.world_size, config.checkpoint.verify_checkpoint)
    problems = [p for p in state.comm.all_gather_object(problem) if p]
    if problems:
        raise CheckpointError(problems[0])
    lines: list[str] = []
    schedule, error = _attempt(lambda: check_deepspeed_resume(config, batch, checkpoint, lines.append)) \
        if state.is_first_rank else (None, None)
    agree(state, error)
    for line in lines:
        log(line)
    return state.comm.all_gather_object(schedule)[0]


def check_resume(config, state: ParallelState, iteration_dir: Path, log: Callable[[str], None],
                 batch: BatchSchedule) -> tuple[Optional[LearningRateSchedule], dict]:
    """The checkpoint's metadata fits this run's data settings, the samples its schedule covers and its
    learning-rate schedule (Megatron's rule), and every file of it is intact. Returns the checkpoint's
    schedule when it is to be kept, and its metadata."""
    checkpoint = config.checkpoint
    megatron = is_megatron_checkpoint(iteration_dir)  # a Megatron-LM save folder: its common.pt, checked alike
    if megatron:  # imported only then: DCP imports DTensor and sympy, which --help must not pay for (test_startup.py)
        from checkpoint.megatron_resume import megatron_metadata, verify_megatron_records
    metadata, error = _attempt(lambda: megatron_metadata(iteration_dir, config) if megatron
                               else read_metadata(iteration_dir))
    agree(state, error)
    schedule = None
    if not checkpoint.finetune:  # a fine-tuning run starts a new sample sequence anyway
        note, error = _attempt(lambda: check_resume_matches(metadata, config, iteration_dir,
                                                            checkpoint.override_data_on_resume))
        agree(state, error)
        if note:
            log(note)
        agree(state, _attempt(lambda: check_samples_fit(metadata, config, batch, iteration_dir))[1])
        agree(state, _attempt(lambda: check_resume_model(metadata, config.model, iteration_dir))[1])
    if not checkpoint.finetune and checkpoint.load_optim:  # as Megatron: only when it loads the scheduler
        outcome, error = _attempt(lambda: schedule_on_resume(
            config, batch, metadata.get("config") or {}, iteration_dir))
        agree(state, error)
        schedule, note = outcome
        if note:
            log(note)
    if megatron:  # megatron_metadata verified its files' presence and sizes; now their records' CRC-32
        if checkpoint.verify_checkpoint:
            problem = verify_megatron_records(iteration_dir, state.rank, state.world_size)
            problems = [p for p in state.comm.all_gather_object(problem) if p]
            if problems:
                raise CheckpointError(problems[0])
    else:
        verify_for_job(iteration_dir, metadata, state, check_content=checkpoint.verify_checkpoint)
    return schedule, metadata
