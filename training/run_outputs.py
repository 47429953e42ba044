"""What a run writes as it goes: its metrics (JSONL, W&B, TensorBoard) and its checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from arguments.config import TORCH_DIST, PretrainConfig
from checkpoint.lineage import RunIdentity
from checkpoint.megatron_writer import save_megatron_checkpoint
from checkpoint.sharded import prune_checkpoints, save_checkpoint
from data.tokenizer import GPTTokenizer, RunTokenizer
from parallel.state import ParallelState
from training.build import Built
from training.metrics import MetricsWriter, count_records, drop_redone_records, end_last_line, start_wandb
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


def checkpoint_saver(config: PretrainConfig, state: ParallelState, built: Built,
                     tokenizer: RunTokenizer, identity: RunIdentity, batch=None) -> Optional[SaveCheckpoint]:
    """Saves to --save and prunes to --keep-last; None without --save. With --ckpt-format torch_dist, in
    Megatron-LM's layout (checkpoint/megatron_writer.py; `batch` is the run's batch schedule, which its scheduler
    state is counted in)."""
    checkpoint = config.checkpoint
    if not checkpoint.save:
        return None
    if checkpoint.ckpt_format == TORCH_DIST and config.megatron_format_unwritten() is None:
        def save_megatron(iteration: int, consumed_samples: int, lr: float, schedule_samples: int) -> None:
            save_megatron_checkpoint(checkpoint.save, iteration, consumed_samples, built.model, built.zero.optimizer,
                                     config, state, batch, lr=lr, schedule_samples=schedule_samples)
        return save_megatron
    # A NullTokenizer has no files, and a SentencePiece .model is not what scripts/convert_to_hf.py reads from
    # a checkpoint's tokenizer/ (a tokenizer.json): the checkpoint then holds no tokenizer/ copy.
    saved_tokenizer = tokenizer if isinstance(tokenizer, GPTTokenizer) else None

    def save(iteration: int, consumed_samples: int, lr: float, schedule_samples: int) -> None:
        save_checkpoint(checkpoint.save, iteration, consumed_samples, built.model, built.zero.optimizer, built.rng,
                        config, state, tokenizer=saved_tokenizer, lr=lr, identity=identity,
                        schedule_samples=schedule_samples)
        prune_checkpoints(checkpoint.save, checkpoint.keep_last, state, identity.run_id)

    return save
