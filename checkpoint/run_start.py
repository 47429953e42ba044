"""Everything a training run claims and checks before any work, agreed by every rank: finish a killed first save, decide
fresh start or resume, take the save and metrics locks, prove outputs writable, verify the checkpoint. Each step ends in
an agreement, so an error is the same on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from arguments.batch_schedule import BatchSchedule
from arguments.checkpoint_config import sample_order
from arguments.schedule import LearningRateSchedule
from base.output_locks import MetricsFileLock, RunLock
from checkpoint.agreement import agree, attempt
from checkpoint.deepspeed.resume import refuse_save_into_deepspeed
from checkpoint.formats import format_named
from checkpoint.global_load import ResumePoint
from checkpoint.lineage import RunIdentity, identity_on_start, new_id
from checkpoint.null_tokenizer_reading import NullTokenizerReading, saved_null_tokenizer
from checkpoint.output_paths import prepare_output_directory, prepare_output_file, refuse_training_output_in_checkpoint
from checkpoint.save_directory import SaveDirectoryLock
from checkpoint.start_decision import StartDecision, check_save_directory, continues_training, decide_start
from checkpoint.tokenizer_check import SavedTokenizer, saved_tokenizer
from checkpoint.unfinished_save import finish_unfinished_save, needs_finishing
from checkpoint.upcycling import check_upcycling_start, upcycled_start
from parallel.state import ParallelState


@dataclass
class RunStart:
    resume_from: Optional[Path]  # the verified iteration directory to load; None: a fresh start
    locks: list[RunLock]  # held by rank 0 while the run writes: --save's and --metrics-file's
    # The checkpoint's schedule when --use-checkpoint-opt_param-scheduler keeps it: settings resolve with it, never
    # patched.
    lr_schedule: Optional[LearningRateSchedule] = None
    identity: Optional[RunIdentity] = None
    format_name: Optional[str] = None  # resume_from's format (checkpoint/formats.py)
    metrics_file: Optional[str] = None  # --metrics-file, or the lineage's own (default_metrics_file)
    # The checkpoint's tokenizer, compared once loaded; None: nothing to compare.
    saved_tokenizer: Optional[SavedTokenizer] = None
    # The checkpoint's data-parallel size where the run continues it: the cyclic sampler's buckets follow it.
    saved_data_parallel_size: Optional[int] = None
    # how the checkpoint's run read NullTokenizer's --vocab-size, where not as by default; None: the default
    saved_null_tokenizer: Optional[NullTokenizerReading] = None
    # (iteration, consumed samples) the run's data continues from: the datasets are sized for what it reads
    data_start: tuple[int, int] = (0, 0)

    def load(self, built, state: ParallelState, model_config, *, load_optimizer: bool, load_rng: bool,
             finetune: bool) -> ResumePoint:
        """The load from resume_from, by its format's handler."""
        return format_named(self.format_name).module().load_resume(
            self.resume_from, built.model, built.zero.optimizer, built.rng, state, model_config,
            load_optimizer=load_optimizer, load_rng=load_rng, finetune=finetune)

    def release(self) -> None:
        while self.locks:
            self.locks.pop().release()


def default_metrics_file(run_id: str) -> str:
    """Without --metrics-file each lineage writes its own file, so two runs from one folder never share one."""
    return f"runs/{run_id}/metrics.jsonl"


def claim_run_start(config, state: ParallelState, cache_dir: Optional[str], log: Callable[[str], None],
                    batch: BatchSchedule) -> RunStart:
    """The checks and claims above, in order; raises the same error on every rank. `batch`: the run's batch schedule."""
    checkpoint = config.checkpoint
    locks: list[RunLock] = []

    def claim(lock: RunLock) -> None:
        lock.acquire()
        locks.append(lock)

    def claim_metrics_file(path: str) -> None:
        refuse_training_output_in_checkpoint(path, "--metrics-file")
        prepare_output_file(path, "--metrics-file")
        claim(MetricsFileLock(path, log=log))
        started.metrics_file = path

    def first_rank() -> StartDecision:
        if checkpoint.save:
            refuse_training_output_in_checkpoint(checkpoint.save, "--save", save_directory=True)
        # --wandb-save-dir only where W&B runs, as in Megatron-LM.
        wandb_dir = config.logging.wandb_save_dir if config.logging.wandb_project else None
        for directory, flag in ((config.logging.tensorboard_dir, "--tensorboard-dir"), (cache_dir, "--data-cache-dir"),
                                (wandb_dir, "--wandb-save-dir")):
            if directory:
                refuse_training_output_in_checkpoint(directory, flag)
        if needs_finishing(checkpoint.load, checkpoint.save):  # a requeued job whose first save was killed
            claim(SaveDirectoryLock(checkpoint.save, log=log))
            finish_unfinished_save(Path(checkpoint.save), log)
        decision = decide_start(checkpoint.load, checkpoint.save, checkpoint.universal_checkpoint,
                                checkpoint.exit_on_missing_checkpoint)
        if checkpoint.moe_use_upcycling:
            check_upcycling_start(checkpoint.save, checkpoint.load, decision.resume_from, decision.format_name)
        if checkpoint.save:
            refuse_save_into_deepspeed(checkpoint.save)
            prepare_output_directory(checkpoint.save, "--save")
            if not locks:
                claim(SaveDirectoryLock(checkpoint.save, log=log))
            load_source = config.sources.get("load")  # arguments/megatron/ckpt_step.py: --ckpt-step names --load's
            check_save_directory(checkpoint.save, decision.resume_from, checkpoint.finetune, checkpoint.overwrite_save,
                                 ckpt_step=load_source is not None and load_source.origin == "--ckpt-step")
        if config.logging.metrics_file is not None:
            claim_metrics_file(config.logging.metrics_file)
        for directory, flag in ((config.logging.tensorboard_dir, "--tensorboard-dir"), (wandb_dir, "--wandb-save-dir")):
            if directory:
                prepare_output_directory(directory, flag)
        return decision

    started = RunStart(None, locks, metrics_file=config.logging.metrics_file)
    decision, error = attempt(first_rank) if state.is_first_rank else (None, None)
    try:
        agree(state, error)
        # Rank 0's ids: a fresh lineage (kept only if the checkpoint has none) and this launch's.
        decision, fresh_run_id, launch_id = state.comm.all_gather_object((decision, new_id(), new_id()))[0]
        if cache_dir is not None:  # every rank writes its own copy of the prepared corpus and caches
            agree(state, attempt(lambda: prepare_output_directory(cache_dir, "--data-cache-dir"))[1])
        if decision.note:
            log(decision.note)
        metadata = None
        if decision.resume_from is not None:  # the checks of its format (checkpoint/formats.py), before any work
            started.format_name = decision.format_name
            started.lr_schedule, metadata = format_named(decision.format_name).module().check_start(
                config, state, decision.resume_from, log, batch)
        started.saved_null_tokenizer = saved_null_tokenizer(metadata)
        if metadata is not None and continues_training(config):
            started.saved_tokenizer = saved_tokenizer(metadata, decision.resume_from)
            started.saved_data_parallel_size = metadata.get("data_parallel_size")
            started.data_start = (metadata.get("iteration", 0), metadata.get("consumed_samples") or 0)
        if metadata is not None and checkpoint.moe_use_upcycling:
            started.data_start = upcycled_start(metadata, checkpoint.finetune)
        order = sample_order(checkpoint.ckpt_format)
        if checkpoint.moe_use_upcycling and not checkpoint.finetune:  # the dense run's samples read on, in its order
            order = identity_on_start(metadata, False, fresh_run_id, launch_id).sample_order
        started.identity = identity_on_start(metadata, checkpoint.finetune or checkpoint.moe_use_upcycling,
                                              fresh_run_id, launch_id, order)
        if started.metrics_file is None:  # known now: a resume's lineage is its checkpoint's
            path = default_metrics_file(started.identity.run_id)
            agree(state, attempt(lambda: claim_metrics_file(path))[1] if state.is_first_rank else None)
            started.metrics_file = path
    except BaseException:
        started.release()
        raise
    started.resume_from = decision.resume_from
    return started
