"""The dry run's observer of the real train step (training/step_observer.py): planner/dry_run.py runs
training/train_step.py's DataParallelTrainStep on the meta device with this watching, so every collective the
step makes is counted by the code that counts it live, and a collective added to the step is in the plan with
no edit here. What the observer adds is only what a meta run cannot do or should not repeat:

- it runs the first micro-batch and the last of a long accumulation (`planned_micro_batches`) and counts, for
  each one between, the bytes the first sent: they run the first's code on its shapes under no_sync, one at a
  time, so they hold no more than it and send what it sends; the plan costs the same at 2 and 512 steps;
- it takes the optimizer's collectives without its arithmetic (`ShardedAdamW.step_collectives_only`);
- it tells the block probe which phase runs (forward, or backward with its recompute meter) and where it is.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

from parallel.comm import DryRunCommunicator
from training.step_observer import NoObserver
from zero.activations import ActivationMonitor
from zero.optimizer import ShardedAdamW, StepResult


def planned_micro_batches(steps: int) -> list[int]:
    """The micro-batches of a step without pipeline stages that a plan runs: the first (under no_sync) and the last
    (which synchronizes the gradients); the ones between send what the first sends (PlanObserver adds it)."""
    return sorted({0, steps - 1})


def comm_difference(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]],
                    skip: Sequence[str] = ()) -> dict[str, dict[str, int]]:
    """The bytes counted per group and kind between two snapshots, but for the groups in `skip`. A group counted
    from its first use (context parallelism's, the experts') may be missing from `before`: it counted nothing then."""
    return {group: {kind: after[group][kind] - before.get(group, {}).get(kind, 0) for kind in kinds}
            for group, kinds in after.items() if group not in skip}


class PlanObserver(NoObserver):
    """Watches a DataParallelTrainStep's iteration for the plan (see the module docstring). After it ran:
    `simulated` the micro-batches run, `passes_copy` gloo's largest copy in forward and backward, and
    `copy_peak_bytes` the most a collective's copy and the activations still saved as it started held together.

    The copy is read at its collective, as planner/pipeline_plan.py reads a backward's: the gradients' reduction
    starts once a bucket is ready, at the end of the last micro-batch's backward, when autograd has freed most of
    the activations, so the largest copy rarely sits on top of the activations' peak. Adding it to that peak (an
    upper bound) planned a CP 2 run's rank 25 MiB above its measured peak (measured/predicted 0.82;
    tests/planner/test_plan_context_parallel_live.py): its whole gradient buffer is reduced over DP x CP."""

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
        self.comm.on_transport_copy = self._at_copy  # until the passes end (not the optimizer step's copies)

    def _at_copy(self, copy_bytes: int) -> None:
        # what is saved now: the forward's meter and, in backward, a recompute's (planner/dry_run.py's probe)
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
