"""What a run writes as it goes: its metrics (JSONL, W&B, TensorBoard) and its checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from arguments.config import PretrainConfig
from checkpoint.lineage import RunIdentity
from checkpoint.run_saves import CheckpointSaves
from data.tokenizer import RunTokenizer
from parallel.state import ParallelState
from resilience.rerun_resume import machine_checkpoint_state
from resilience.rerun_state import RerunStateMachine
from training.build import Built
from training.metrics import MetricsWriter, count_records, drop_redone_records, end_last_line, start_wandb
from training.run_commands import given_flags, record_command
from training.tensorboard_sink import open_tensorboard


def open_metrics(config: PretrainConfig, state: ParallelState, identity: RunIdentity, start_iteration: int,
                 log: Callable[[str], None], metrics_file: str) -> MetricsWriter:
    """The metrics file (appended to), W&B and TensorBoard, written by rank 0."""
    metrics_path = Path(metrics_file)
    log(f"> run {identity.run_id}, launch {identity.launch_id}: in every metrics record and save")
    if state.is_first_rank:
        dropped = drop_redone_records(str(metrics_path), start_iteration, identity.run_id) if start_iteration > 0 else 0
        end_last_line(str(metrics_path))
        if dropped:
            log(f"> dropped {dropped} records after iteration {start_iteration} from {metrics_path}: this run "
                f"redoes those iterations")
        elif start_iteration == 0 and (earlier := count_records(str(metrics_path))):
            log(f"> appending to {metrics_path}, which holds {earlier} records of earlier runs")
        record_command(metrics_path, identity.fields(), given_flags(config))  # the plot's labels
    wandb_run = None
    if state.is_first_rank:
        wandb_run = start_wandb(config.logging.wandb_project, config.logging.wandb_run_name,
                                config.logging.wandb_entity, config.to_dict(),
                                config.logging.wandb_save_dir or str(metrics_path.parent))
    tensorboard = open_tensorboard(config.logging.tensorboard_dir) if state.is_first_rank else None
    return MetricsWriter(str(metrics_path), enabled=state.is_first_rank, wandb_run=wandb_run, tensorboard=tensorboard,
                         identity=identity.fields())


def checkpoint_saver(config: PretrainConfig, state: ParallelState, built: Built, tokenizer: RunTokenizer,
                     identity: RunIdentity, batch=None,
                     rerun: Optional[RerunStateMachine] = None) -> Optional[CheckpointSaves]:
    """Saves to --save and prunes to --keep-last; None without --save."""
    if not config.checkpoint.save:
        return None
    return CheckpointSaves(config, state, built.model, built.zero.optimizer, built.rng, tokenizer, identity, batch,
                           rerun_state=lambda: machine_checkpoint_state(rerun),
                           rerun_validates=rerun is not None and config.training.faults.rerun_mode == "validate_results")
