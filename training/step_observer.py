"""What a train step tells whoever watches it run: its phases, its micro-batches, the slots of its pipeline
schedule; and the two choices a watcher may make, which micro-batches run and how the optimizer steps.

A live run's steps take `NO_OBSERVER`: every micro-batch runs and the optimizer takes its real step, so the
hooks change nothing. The planner's dry run (planner/dry_run.py) drives the same steps on the meta device with
an observer that measures at these points, runs the first and last micro-batches of a long accumulation (or the
schedule's warm-up and steady state) and adds the bytes of the rest, and replaces the optimizer's arithmetic,
which needs values a meta tensor does not have, by its collectives (`ShardedAdamW.step_collectives_only`). So
every collective a step makes is counted by the dry run, because the dry run runs the step.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Optional, Protocol, Sequence

from parallel.pipeline_schedules import Slot
from zero.optimizer import ShardedAdamW, StepResult


class StepObserver(Protocol):
    def micro_batches(self, accumulation_steps: int) -> Sequence[int]:
        """Which of the iteration's `accumulation_steps` micro-batches to run (without pipeline stages)."""

    def pipeline_micro_batches(self, accumulation_steps: int, stages: int, stage: int, chunks: int,
                               group_size: Optional[int]) -> int:
        """How many of the iteration's micro-batches the pipeline schedule runs (the first that many)."""

    def phase(self, name: str) -> ContextManager[None]:
        """A context around each forward ("forward") and each backward ("backward") of a micro-batch."""

    def micro_batch_start(self, micro_batch: int) -> None:
        """Before a micro-batch runs (without pipeline stages)."""

    def micro_batch_end(self, micro_batch: int) -> None:
        """After a micro-batch's backward and its gradient synchronization (without pipeline stages)."""

    def schedule(self, slots: Sequence[Slot]) -> None:
        """The slots of this rank's pipeline schedule, before the first runs."""

    def slot_start(self, index: int, slot: Slot) -> None:
        """Before slot `index` of the schedule runs."""

    def slot_end(self, index: int, slot: Slot) -> None:
        """After slot `index` ran, its sends posted and (a backward) its gradient synchronization done."""

    def passes_end(self) -> None:
        """After the last micro-batch, before what the step does once per iteration (the pipeline's shared
        embedding and loss, the optimizer step)."""

    def optimizer_step(self, optimizer: ShardedAdamW) -> Optional[StepResult]:
        """Take the optimizer's step: its result, or None where only its collectives ran."""


class NoObserver:
    """A live run: all micro-batches, the real optimizer step, and nothing told."""

    def micro_batches(self, accumulation_steps: int) -> Sequence[int]:
        return range(accumulation_steps)

    def pipeline_micro_batches(self, accumulation_steps: int, stages: int, stage: int, chunks: int,
                               group_size: Optional[int]) -> int:
        return accumulation_steps

    def phase(self, name: str) -> ContextManager[None]:
        return contextlib.nullcontext()

    def micro_batch_start(self, micro_batch: int) -> None:
        pass

    def micro_batch_end(self, micro_batch: int) -> None:
        pass

    def schedule(self, slots: Sequence[Slot]) -> None:
        pass

    def slot_start(self, index: int, slot: Slot) -> None:
        pass

    def slot_end(self, index: int, slot: Slot) -> None:
        pass

    def passes_end(self) -> None:
        pass

    def optimizer_step(self, optimizer: ShardedAdamW) -> Optional[StepResult]:
        return optimizer.step()


NO_OBSERVER = NoObserver()
