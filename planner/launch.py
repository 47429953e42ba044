"""The planner as a training launch uses it: `--dry-run`, and the rank's planned peak, which a live run checks against
free memory before the build and compares its first iteration with. The dry run itself is imported only when needed."""

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
    """The planner's peak for this rank from a dry run of the same config and batch schedule: (device bytes, host bytes,
    ""), or (None, 0, why), since a failed prediction must not stop a run. `first_iteration`: iteration 1's device peak,
    before the constant buffers exist."""
    return _planned_peaks(config, state, vocab_size, batch)[1 if first_iteration else 0]


def _planned_peaks(config: PretrainConfig, state: ParallelState, vocab_size: int,
                   batch: BatchSchedule) -> tuple[tuple[Optional[int], int, str], tuple[Optional[int], int, str]]:
    """predicted_peak's two figures from one dry run: (the run's peak, iteration 1's)."""
    from planner.dry_run import Cluster, dry_run

    cluster = Cluster(state.world_size, state.world_size, None, state.device.type)
    try:
        plan = dry_run(config, cluster, vocab_size, state.rank, batch=batch)
        # iteration 1 comes before any save: no --async-save staging yet
        return (plan.total_bytes, plan.host_total_bytes, ""), \
            (plan.first_iteration_bytes, plan.host_total_bytes - plan.checkpoint_staging_bytes, "")
    except Exception as error:  # noqa: BLE001 - any planner failure is reported, training goes on
        failed = (None, 0, f"the planner failed: {type(error).__name__}: {error}")
        return failed, failed


class RankPeak:
    """One run's figures from the planner: before the data is built (`before_data`, the check before the build, the
    run's peak) and after the tokenizer is loaded (`__call__`, iteration 1's peak), reusing the first plan when the
    padded vocabulary is the same."""

    def __init__(self) -> None:
        self._planned: dict[int, tuple] = {}

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
    parallel = config.parallel
    try:  # the live launch's own check, before any arithmetic on the DP size
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
