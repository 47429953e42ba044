"""What a training run checks before it claims any output: the batch arithmetic and BigScience's kill switch; every rank
takes the same branch."""

from __future__ import annotations

import os
from typing import Callable, Optional

from arguments.batch_schedule import BatchSchedule, batch_schedule
from arguments.checkpoint_config import CheckpointConfig
from arguments.config import PretrainConfig
from arguments.schedule import train_iterations
from parallel.state import ParallelState

Log = Callable[[str], None]


def first_rank_log(state: ParallelState) -> Log:
    """print on rank 0 (flushed: ranks and launchers interleave), nothing elsewhere."""
    return (lambda line: print(line, flush=True)) if state.is_first_rank else (lambda line: None)


def check_before_claim(config: PretrainConfig, state: ParallelState, log: Log) -> BatchSchedule:
    """The run's batch schedule, computed once, after the checks that need no data or model."""
    batch = batch_schedule(config, state.data_parallel_size)
    train_iterations(config.training, batch)  # a --train-samples too short for one iteration is refused here
    config.training.fault_injector.check_world(state.world_size)  # Megatron-Core's get_fault_ranks asserts it
    if batch.notes:  # DeepSpeed JSON batch values the run does not use
        log("> warning: " + "; ".join(batch.notes))
    return batch


def kill_switch_found(checkpoint: CheckpointConfig, state: ParallelState, log: Log) -> Optional[str]:
    """BigScience: a killed group does not start. Why not, or None."""
    kill_switch = checkpoint.kill_switch_path
    if kill_switch is None or not state.comm.any_rank([os.path.exists(kill_switch)], state.device)[0]:
        return None
    log(f"> found the kill switch {kill_switch} (--kill-switch-path): not starting")
    return f"found the kill switch {kill_switch}"
