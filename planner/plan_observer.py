"""The dry run's observer of the real train step, so every collective the step makes is counted by the live code. It
adds only what a meta run cannot do or should not repeat: it runs the first and last micro-batch and counts the ones
between as copies of the first."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

from parallel.comm import DryRunCommunicator
from training.step_observer import NoObserver
from zero.activations import ActivationMonitor
from zero.optimizer import ShardedAdamW, StepResult


def planned_micro_batches(steps: int) -> list[int]:
    """The micro-batches a plan runs: the first (under no_sync) and the last."""
    return sorted({0, steps - 1})


def comm_difference(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]],
                    skip: Sequence[str] = ()) -> dict[str, dict[str, int]]:
    """Bytes per group and kind between two snapshots, but for the groups in `skip`."""
    return {group: {kind: after[group][kind] - before.get(group, {}).get(kind, 0) for kind in kinds}
            for group, kinds in after.items() if group not in skip}


class PlanObserver(NoObserver):
    """Watches a DataParallelTrainStep's iteration for the plan; `copy_peak_bytes`: gloo's copy with the activations
    saved as its collective starts."""

    def __init__(self, comm: DryRunCommunicator, monitor: ActivationMonitor, probe) -> None:
        self.comm, self.monitor, self.probe = comm, monitor, probe
        self.steps = 0
        self.simulated: list[int] = []
        self.passes_copy = 0
        self.copy_peak_bytes = 0
        self._before: dict[str, dict[str, int]] = {}
        self._repeated: dict[str, dict[str, int]] = {}

    @property
    def progress(self):
        return self.probe.progress

    def micro_batches(self, accumulation_steps: int) -> Sequence[int]:
        self.steps = accumulation_steps
        self.simulated = planned_micro_batches(accumulation_steps)
        if self.progress is not None:
            self.progress.planned = len(self.simulated)
        return self.simulated

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.probe.phase = name
        with self.probe.backward_meter.hooks() if name == "backward" else contextlib.nullcontext():
            yield

    def micro_batch_start(self, micro_batch: int) -> None:
        if self.progress is not None:
            self.progress.micro_batch = micro_batch
        self._before = self.comm.stats.snapshot()
        self.comm.on_transport_copy = self._at_copy

    def _at_copy(self, copy_bytes: int) -> None:
        self.copy_peak_bytes = max(self.copy_peak_bytes, self.probe.saved_now() + copy_bytes)
        self.probe.sample("copy", copy_bytes)

    def micro_batch_end(self, micro_batch: int) -> None:
        if micro_batch == 0 and micro_batch != self.steps - 1:
            self._repeated = comm_difference(self.comm.stats.snapshot(), self._before)

    def passes_end(self) -> None:
        self.comm.stats.add_counts(self._repeated, times=self.steps - len(self.simulated))
        self.comm.on_transport_copy = None
        self.passes_copy = self.comm.take_largest_transport_copy()

    def optimizer_step(self, optimizer: ShardedAdamW) -> Optional[StepResult]:
        optimizer.step_collectives_only()
        return None
