"""The planner as a training launch uses it: `--dry-run` (plan this launch's rank and print it), and
the rank's planned peak, which a live run checks against free memory before the build
(training/memory_fit.py) and compares its first iteration with (training/metrics.py's MemoryCheck).
pretrain_gpt.py imports this module; the dry run itself is imported only when it is needed."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from arguments.batch_schedule import BatchSchedule, batch_schedule
from arguments.config import ConfigError, PretrainConfig
from parallel.launch_environment import read_launch_environment
from parallel.state import ParallelState, check_grid_divides, resolve_device
from planner.vocabulary import launch_vocab


def predicted_peak(config: PretrainConfig, state: ParallelState, vocab_size: int, batch: BatchSchedule,
                   first_iteration: bool = False) -> tuple[Optional[int], int, str]:
    """The planner's peak for this rank (a dry run of the same config and batch schedule, a few seconds
    at most): (device bytes, host bytes, ""), or (None, 0, why): a prediction that fails must not stop a run.
    The host bytes are what offload and P_a+cpu keep in host memory (RankPlan.host_total_bytes). The device
    bytes are the run's peak (RankPlan.total_bytes), or with `first_iteration` iteration 1's
    (RankPlan.first_iteration_bytes: its constant buffers appear at its first reduction)."""
    return _planned_peaks(config, state, vocab_size, batch)[1 if first_iteration else 0]


def _planned_peaks(config: PretrainConfig, state: ParallelState, vocab_size: int,
                   batch: BatchSchedule) -> tuple[tuple[Optional[int], int, str], tuple[Optional[int], int, str]]:
    """predicted_peak's two figures from one dry run: (the run's peak, iteration 1's)."""
    from planner.dry_run import Cluster, dry_run

    cluster = Cluster(state.world_size, state.world_size, None, state.device.type)
    try:
        plan = dry_run(config, cluster, vocab_size, state.rank, batch=batch)
        # iteration 1 comes before any save: the checkpoint an --async-save stages is not held yet
        return (plan.total_bytes, plan.host_total_bytes, ""), \
            (plan.first_iteration_bytes, plan.host_total_bytes - plan.checkpoint_staging_bytes, "")
    except Exception as error:  # noqa: BLE001 - any planner failure is reported, training goes on
        failed = (None, 0, f"the planner failed: {type(error).__name__}: {error}")
        return failed, failed


class RankPeak:
    """One training run's figures from the planner, planned once: before the data is built with the
    launch's vocabulary (`before_data`, for training/memory_fit.py's check), and after the tokenizer
    is loaded (`__call__`, training/prepare.py's PredictPeak, for the memory line after iteration 1: iteration
    1's peak, RankPlan.first_iteration_bytes), which reuses the first plan when the padded vocabulary (the only
    thing the tokenizer changes in the model's shapes) is the same. The check before the build takes the run's
    peak (RankPlan.total_bytes), which the iterations after the first reach."""

    def __init__(self) -> None:
        self._planned: dict[int, tuple] = {}  # by padded vocabulary: _planned_peaks's pair

    def __call__(self, config: PretrainConfig, state: ParallelState, vocab_size: int,
                 batch: BatchSchedule) -> tuple[Optional[int], int, str]:
        return self._peaks(config, state, vocab_size, batch)[1]

    def _peaks(self, config: PretrainConfig, state: ParallelState, vocab_size: int, batch: BatchSchedule) -> tuple:
        try:
            key = dataclasses.replace(config.model, vocab_size=vocab_size).padded_vocab_size(
                config.parallel.tensor_model_parallel_size)
        except ConfigError:  # the dry run says why, as a failed prediction
            key = -vocab_size
        if key not in self._planned:
            self._planned[key] = _planned_peaks(config, state, vocab_size, batch)
        return self._planned[key]

    def before_data(self, config: PretrainConfig, state: ParallelState,
                    batch: BatchSchedule) -> tuple[Optional[int], int, str]:
        try:
            vocab_size = launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0]
        except Exception as error:  # noqa: BLE001 - a tokenizer the flags name but that does not load is
            return None, 0, f"no vocabulary to plan with: {type(error).__name__}: {error}"  # reported later
        return self._peaks(config, state, vocab_size, batch)[0]


def dry_run_launch(config: PretrainConfig) -> None:
    """--dry-run: plan this launch's rank without a process group and print it (rank 0 only)."""
    from planner.dry_run import Cluster, dry_run
    from planner.plan import format_plan

    launch = read_launch_environment()
    try:
        device = resolve_device(config.training.device, launch.local_rank)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    parallel = config.parallel  # DP: what TP and the pipeline stages leave of the world
    try:  # the live launch's own check (parallel/state.py initialize), before any arithmetic on the DP size
        check_grid_divides(launch.world_size, parallel.tensor_model_parallel_size,
                           parallel.pipeline_model_parallel_size)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    batch = batch_schedule(config, launch.world_size // (parallel.tensor_model_parallel_size
                                                         * parallel.pipeline_model_parallel_size))
    budget = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    cluster = Cluster(launch.world_size, launch.local_world_size or launch.world_size, budget, device.type)
    vocab, source = launch_vocab(config.checkpoint, config.data, config.model, config.sources)
    if launch.rank == 0:
        print(format_plan(dry_run(config, cluster, vocab, launch.rank, batch=batch), cluster, config, source),
              flush=True)
