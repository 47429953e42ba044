"""What a run writes as it goes: its metrics (JSONL, W&B, TensorBoard) and its checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from arguments.config import TORCH_DIST, PretrainConfig
from checkpoint.async_save import AsyncCheckpointSaver, saving_mode_line, writer_priorities
from checkpoint.lineage import RunIdentity
from checkpoint.sharded import prune_checkpoints, save_checkpoint
from data.tokenizer import GPTTokenizer, RunTokenizer
from parallel.state import ParallelState
from training.build import Built
from training.metrics import MetricsWriter, count_records, drop_redone_records, end_last_line, start_wandb
from training.rerun_resume import machine_checkpoint_state
from training.rerun_state import RerunStateMachine
from training.tensorboard_sink import open_tensorboard

# Writes a checkpoint: (iteration, consumed samples, learning rate, the schedule's samples) -> None.
SaveCheckpoint = Callable[[int, int, float, int], None]


def open_metrics(config: PretrainConfig, state: ParallelState, identity: RunIdentity, start_iteration: int,
                 log: Callable[[str], None]) -> MetricsWriter:
    """The metrics file (appended to, never truncated: only this lineage's records of iterations this
    run redoes are dropped), W&B and TensorBoard, written by rank 0."""
    metrics_path = Path(config.logging.metrics_file)
    log(f"> run {identity.run_id}, launch {identity.launch_id}: in every metrics record and save")
    if state.is_first_rank:
        dropped = drop_redone_records(str(metrics_path), start_iteration, identity.run_id) if start_iteration > 0 else 0
        end_last_line(str(metrics_path))
        if dropped:
            log(f"> dropped {dropped} records after iteration {start_iteration} from {metrics_path}: this run "
                f"redoes those iterations")
        elif start_iteration == 0 and (earlier := count_records(str(metrics_path))):
            log(f"> appending to {metrics_path}, which holds {earlier} records of earlier runs")
    wandb_run = None
    if state.is_first_rank:
        wandb_run = start_wandb(config.logging.wandb_project, config.logging.wandb_run_name,
                                config.logging.wandb_entity, config.to_dict(), str(metrics_path.parent))
    tensorboard = open_tensorboard(config.logging.tensorboard_dir) if state.is_first_rank else None
    return MetricsWriter(str(metrics_path), enabled=state.is_first_rank, wandb_run=wandb_run, tensorboard=tensorboard,
                         identity=identity.fields())


class CheckpointSaves:
    """Saves to --save and prunes to --keep-last. Called to save (a `SaveCheckpoint`); with --async-save (and
    --use-persistent-ckpt-worker) each save is staged and written in the background (checkpoint/async_save.py):
    `poll` commits it once every rank's files are in (the loop calls it before every iteration), `finish` waits for
    the last one (the end of the run, an early exit, a divergence: every rank gets there), and `abandon` lets it go
    (an error: nothing more is committed). Synchronous saves are committed before the call returns, so the three
    do nothing then."""

    def __init__(self, config: PretrainConfig, state: ParallelState, built: Built, tokenizer: RunTokenizer,
                 identity: RunIdentity, batch=None, rerun: Optional[RerunStateMachine] = None) -> None:
        self.config, self.state, self.built, self.identity, self.batch = config, state, built, identity, batch
        self.rerun = rerun  # its pending re-run goes into each save (training/rerun_resume.py)
        # --ckpt-format torch_dist: Megatron-LM's layout (checkpoint/megatron_writer.py), written synchronously
        self.megatron = config.checkpoint.ckpt_format == TORCH_DIST and config.megatron_format_unwritten() is None
        # A NullTokenizer has no files, and a SentencePiece .model is not what scripts/convert_to_hf.py reads from
        # a checkpoint's tokenizer/ (a tokenizer.json): the checkpoint then holds no tokenizer/ copy.
        self.tokenizer = tokenizer if isinstance(tokenizer, GPTTokenizer) else None
        checkpoint = config.checkpoint
        self.background = AsyncCheckpointSaver(state, *writer_priorities(checkpoint, state.device.type)) \
            if checkpoint.saves_in_background and not self.megatron else None
        self.mode_line = saving_mode_line(checkpoint, self.background.writer.note if self.background else "",
                                          state.device.type)
        if self.megatron:
            self.mode_line = ("> checkpoints: saved synchronously in Megatron-LM's torch_dist layout"
                              + (" (--async-save writes this project's format only)" if checkpoint.async_save else ""))
            if config.model.fp8 is not None and config.model.fp8_recipe == "delayed":
                # TE keeps them in each module's pickled _extra_state, which this writer does not produce
                self.mode_line += ("; without delayed FP8 scaling's amax histories (TransformerEngine's _extra_state): "
                                   "a resume from these starts them fresh at scale 1, said again at the load")
            if rerun is not None and config.training.rerun_mode == "validate_results":
                # Megatron-LM's torch_dist save holds its machine's state; this writer does not write it
                self.mode_line += ("; without the rerun state machine's state: a job resumed from the checkpoint of an "
                                   "exit 16 trains that iteration afresh instead of re-running it to decide")

    def __call__(self, iteration: int, consumed_samples: int, lr: float, schedule_samples: int) -> None:
        checkpoint, built = self.config.checkpoint, self.built
        arguments = (checkpoint.save, iteration, consumed_samples, built.model, built.zero.optimizer, built.rng,
                     self.config)
        settings = dict(tokenizer=self.tokenizer, lr=lr, identity=self.identity, schedule_samples=schedule_samples,
                        rerun_state=machine_checkpoint_state(self.rerun))
        if self.megatron:
            # imported here: torch.distributed.checkpoint imports DTensor and with it sympy, which --help and
            # --print-config must not pay for (tests/test_startup.py)
            from checkpoint.megatron_writer import save_megatron_checkpoint

            save_megatron_checkpoint(checkpoint.save, iteration, consumed_samples, built.model, built.zero.optimizer,
                                     self.config, self.state, self.batch, lr=lr, schedule_samples=schedule_samples)
        elif self.background is None:
            save_checkpoint(*arguments, self.state, **settings)
            self._prune()
        else:
            self._committed(self.background.save(*arguments, **settings))

    def poll(self, iteration: int) -> None:
        if self.background is not None:
            self._committed(self.background.poll(iteration))

    def finish(self) -> None:
        if self.background is not None:
            self._committed(self.background.wait())
            self.background.close()

    def abandon(self) -> None:
        if self.background is not None:
            self.background.abandon()

    def _committed(self, final) -> None:
        if final is not None:
            self._prune()

    def _prune(self) -> None:
        prune_checkpoints(self.config.checkpoint.save, self.config.checkpoint.keep_last, self.state,
                          self.identity.run_id)


def checkpoint_saver(config: PretrainConfig, state: ParallelState, built: Built, tokenizer: RunTokenizer,
                     identity: RunIdentity, batch=None,
                     rerun: Optional[RerunStateMachine] = None) -> Optional[CheckpointSaves]:
    """Saves to --save and prunes to --keep-last; None without --save. With --ckpt-format torch_dist, in
    Megatron-LM's layout (checkpoint/megatron_writer.py; `batch` is the run's batch schedule, which its scheduler
    state is counted in)."""
    return CheckpointSaves(config, state, built, tokenizer, identity, batch, rerun) if config.checkpoint.save else None
