"""The watchers of each step's and save's start and end (--enable-ft-package's sections, rank 0's restart progress),
wrapped around the step and the save the cadence loop is handed."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch.distributed as dist

from resilience.fault_tolerance import FaultTolerance
from resilience.restart_progress import RestartProgress


class LoopEvents:
    def __init__(self, fault_tolerance: Optional[FaultTolerance] = None, progress: Optional[RestartProgress] = None,
                 group: Optional[dist.ProcessGroup] = None) -> None:
        self.fault_tolerance, self.progress, self.group = fault_tolerance, progress, group

    def step_start(self, iteration: int) -> None:
        if self.fault_tolerance is not None:
            self.fault_tolerance.step_start()

    def step_end(self, iteration: int) -> None:
        if self.fault_tolerance is not None:
            self.fault_tolerance.step_end()
        if self.progress is not None:
            self.progress.finished(iteration)

    def save_start(self) -> None:
        if self.fault_tolerance is not None:
            self.fault_tolerance.checkpointing_start()

    def save_end(self) -> None:
        if self.fault_tolerance is not None:
            self.fault_tolerance.checkpointing_end(self.group)

    @property
    def watching(self) -> bool:
        return self.fault_tolerance is not None or self.progress is not None

    def around_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """`step(iteration, ...)` between step_start and step_end (not reached when the step raises)."""
        if not self.watching:
            return step

        def watched_step(iteration: int, *args, **kwargs):
            self.step_start(iteration)
            outcome = step(iteration, *args, **kwargs)
            self.step_end(iteration)
            return outcome
        return watched_step

    def around_save(self, save: Optional[Callable[..., None]]) -> Optional[Callable[..., None]]:
        """The loop's `save_checkpoint(...)` between save_start and save_end."""
        if save is None or not self.watching:
            return save

        def watched_save(*args, **kwargs) -> None:
            self.save_start()
            save(*args, **kwargs)
            self.save_end()
        return watched_save
