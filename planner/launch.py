"""The planner as a training launch uses it: `--dry-run` (plan this launch's rank and print it), and
the predicted peak a live run compares its first iteration with (training/metrics.py's MemoryCheck).
pretrain_gpt.py imports this module; the dry run itself is imported only when it is needed."""

from __future__ import annotations

from typing import Optional

import torch

from arguments.batch_schedule import BatchSchedule, batch_schedule
from arguments.config import ConfigError, PretrainConfig
from parallel.state import ParallelState, read_launch_environment, resolve_device


def predicted_peak(config: PretrainConfig, state: ParallelState, vocab_size: int,
                   batch: BatchSchedule) -> tuple[Optional[int], int, str]:
    """The planner's peak for this rank (a dry run of the same config and batch schedule, a few seconds
    at most): (device bytes, host bytes, ""), or (None, 0, why): a prediction that fails must not stop a run.
    The host bytes are what offload and P_a+cpu keep in host memory (RankPlan.host_total_bytes)."""
    from planner.dry_run import Cluster, dry_run

    cluster = Cluster(state.world_size, state.world_size, None, state.device.type)
    try:
        plan = dry_run(config, cluster, vocab_size, state.rank, batch=batch)
        return plan.total_bytes, plan.host_total_bytes, ""
    except Exception as error:  # noqa: BLE001 - any planner failure is reported, training goes on
        return None, 0, f"the planner failed: {type(error).__name__}: {error}"


def dry_run_launch(config: PretrainConfig) -> None:
    """--dry-run: plan this launch's rank without a process group and print it (rank 0 only)."""
    from planner.dry_run import Cluster, dry_run
    from planner.plan import format_plan, planning_vocab

    launch = read_launch_environment()
    try:
        device = resolve_device(config.training.device, launch.local_rank)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    training = config.training  # DP: what TP and the pipeline stages leave of the world
    batch = batch_schedule(config, launch.world_size // (training.tensor_model_parallel_size
                                                         * training.pipeline_model_parallel_size))
    budget = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    cluster = Cluster(launch.world_size, launch.local_world_size or launch.world_size, budget, device.type)
    vocab, source = planning_vocab(config)
    data = config.data
    if not (data.tokenizer_file or data.vocab_file or data.tokenizer_type or config.model.vocab_size):
        vocab, source = config.data.tokenizer_vocab_size, "the embedded corpus's tokenizer (--tokenizer-vocab-size)"
    if launch.rank == 0:
        print(format_plan(dry_run(config, cluster, vocab, launch.rank, batch=batch), cluster, config, source),
              flush=True)
