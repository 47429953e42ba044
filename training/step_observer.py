"""What a train step tells whoever watches it (its phases, micro-batches, pipeline slots) and the two choices a watcher
makes: which micro-batches run and how the optimizer steps. A live run takes NO_OBSERVER; the planner's dry run measures
at these points on the meta device, so it counts every collective a real step makes."""

from __future__ import annotations

import contextlib
from typing import ContextManager, Optional, Protocol, Sequence

from parallel.pipeline_schedules import Slot
from zero.optimizer import ShardedAdamW, StepResult


class StepObserver(Protocol):
    def micro_batches(self, accumulation_steps: int) -> Sequence[int]:
        """Which of the iteration's micro-batches to run (without pipeline stages)."""

    def pipeline_micro_batches(self, accumulation_steps: int, stages: int, stage: int, chunks: int,
                               group_size: Optional[int]) -> int:
        """How many of the micro-batches the pipeline schedule runs."""

    def phase(self, name: str) -> ContextManager[None]:
        """A context around each forward ("forward") and backward ("backward") of a micro-batch."""

    def micro_batch_start(self, micro_batch: int) -> None:
        """Before a micro-batch runs (without pipeline stages)."""

    def micro_batch_end(self, micro_batch: int) -> None:
        """After a micro-batch's backward and its gradient synchronization (without pipeline stages)."""

    def schedule(self, slots: Sequence[Slot]) -> None:
        """The slots of this rank's pipeline schedule, before the first runs."""

    def slot_start(self, index: int, slot: Slot) -> None:
        """Before slot `index` of the schedule runs."""

    def slot_end(self, index: int, slot: Slot) -> None:
        """After slot `index` ran, its sends posted and its gradient synchronization done."""

    def passes_end(self) -> None:
        """After the last micro-batch, before the step's once-per-iteration work."""

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
