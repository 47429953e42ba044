"""A run's saves to --save, pruned to --keep-last, in the format the registry writes for the run's flags
(checkpoint/formats.py `writer_for`): this project's format, synchronous or in the background (--async-save,
checkpoint/ours/async_save.py), or Megatron-LM's torch_dist layout (checkpoint/torch_dist/writer.py), synchronous."""

from __future__ import annotations

from typing import Callable, Optional

from checkpoint.formats import MEGATRON, writer_for
from checkpoint.lineage import RunIdentity
from checkpoint.ours.async_save import AsyncCheckpointSaver, saving_mode_line, writer_priorities
from checkpoint.ours.sharded import prune_checkpoints, save_checkpoint
from checkpoint.tokenizer_check import tokenizer_record
from data.tokenizer import GPTTokenizer, RunTokenizer
from parallel.state import ParallelState

# Writes a checkpoint: (iteration, consumed samples, learning rate, the schedule's samples) -> None.
SaveCheckpoint = Callable[[int, int, float, int], None]
# What a save writes of the rerun state machine (resilience/rerun_resume.py machine_checkpoint_state): its state, or None
RerunState = Callable[[], Optional[dict]]


class CheckpointSaves:
    """Called to save: (iteration, consumed samples, learning rate, the schedule's samples). With a background
    writer, `poll` commits a save once every rank's files are in (the loop calls it before every iteration), `finish`
    waits for the last one (the end of the run, an early exit, a divergence: every rank gets there), and `abandon`
    lets it go (an error: nothing more is committed). Synchronous saves are committed before the call returns."""

    def __init__(self, config, state: ParallelState, model, optimizer, rng, tokenizer: RunTokenizer,
                 identity: RunIdentity, batch=None, rerun_state: RerunState = lambda: None,
                 rerun_validates: bool = False) -> None:
        self.config, self.state, self.identity, self.batch = config, state, identity, batch
        self.model, self.optimizer, self.rng, self.rerun_state = model, optimizer, rng, rerun_state
        self.format = writer_for(config)
        # A NullTokenizer has no files, and a SentencePiece .model is not what scripts/tools/convert_to_hf.py reads from
        # a checkpoint's tokenizer/ (a tokenizer.json): the checkpoint then holds no tokenizer/ copy.
        self.tokenizer = tokenizer if isinstance(tokenizer, GPTTokenizer) else None
        self.tokenizer_record = tokenizer_record(tokenizer) if tokenizer is not None else None  # every kind's
        checkpoint = config.checkpoint
        self.background = AsyncCheckpointSaver(state, *writer_priorities(checkpoint, state.device.type)) \
            if checkpoint.saves_in_background and self.format is not MEGATRON else None
        if self.format is MEGATRON:
            from checkpoint.torch_dist.writer import saving_mode_line as megatron_mode_line  # DCP: only when used

            self.mode_line = megatron_mode_line(config, rerun_validates)
        else:
            self.mode_line = saving_mode_line(checkpoint, self.background.writer.note if self.background else "",
                                              state.device.type)

    def __call__(self, iteration: int, consumed_samples: int, lr: float, schedule_samples: int) -> None:
        with self.state.comm.collective_work():  # an error on some ranks only ends every rank (parallel/comm.py)
            self._save(iteration, consumed_samples, lr, schedule_samples)

    def _save(self, iteration: int, consumed_samples: int, lr: float, schedule_samples: int) -> None:
        checkpoint = self.config.checkpoint
        if self.format is MEGATRON:
            from checkpoint.torch_dist.writer import save_megatron_checkpoint  # DCP: only when used

            save_megatron_checkpoint(checkpoint.save, iteration, consumed_samples, self.model, self.optimizer,
                                     self.config, self.state, self.batch, lr=lr, schedule_samples=schedule_samples)
            return
        arguments = (checkpoint.save, iteration, consumed_samples, self.model, self.optimizer, self.rng, self.config)
        settings = dict(tokenizer=self.tokenizer, lr=lr, identity=self.identity, schedule_samples=schedule_samples,
                        rerun_state=self.rerun_state(), tokenizer_record=self.tokenizer_record)
        if self.background is None:
            save_checkpoint(*arguments, self.state, **settings)
            self._prune()
        else:
            self._committed(self.background.save(*arguments, **settings))

    def poll(self, iteration: int) -> None:
        if self.background is not None:
            with self.state.comm.collective_work():
                self._committed(self.background.poll(iteration))

    def finish(self) -> None:
        if self.background is not None:
            with self.state.comm.collective_work():
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
