"""--fp8-guard's iteration replay (parallel/fp8/guard.py): the iteration's micro-batches run, the guard takes its
one verdict of the iteration, and where a layer running in FP8 failed its check (on any rank) they run again from
the state the iteration started in, with the failed layers in high precision.

What a replay puts back: the micro-batches (the same samples, resilience/rerun_state.py's ReplayingBatches), the random
generators (dropout draws the same masks), delayed scaling's amax histories, scales and recompute stash (the replay
casts as the first run did: parallel/fp8/recipes.py, DelayedScaling.snapshot), and what the rerun state machine
validated in the discarded run (RerunStateMachine.discard_run). The gradients, the micro-batch counters and the
communication counters start from zero in every run anyway (DataParallelTrainStep.forward_backward_from_zero). Each
replay adds at least one layer to the high-precision set (the guard asks for one only then), so an iteration runs at
most once more than the model has FP8 linears.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from parallel.fp8.guard import GuardMonitor
from parallel.fp8.recipes import DelayedScaling
from resilience.rerun_state import ReplayingBatches, RerunStateMachine


class Fp8GuardReplay:
    """Runs an iteration's passes under --fp8-guard until its verdict stands."""

    def __init__(self, monitor: GuardMonitor, scalings: Sequence[DelayedScaling], batches: ReplayingBatches,
                 save_rng: Callable[[], Any], restore_rng: Callable[[Any], None],
                 rerun: Optional[RerunStateMachine] = None) -> None:
        self.monitor, self.scalings, self.batches = monitor, list(scalings), batches
        self.save_rng, self.restore_rng, self.rerun = save_rng, restore_rng, rerun
        self.replays = 0  # over the run: how many iterations ran again (tests read it)

    def run(self, passes: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`passes()`: the iteration's micro-batches from zeroed gradients, their loss on the device."""
        rng = self.save_rng()
        scales = [scaling.snapshot() for scaling in self.scalings]
        while True:
            loss = passes()
            if not self.monitor.finish_passes():
                return loss
            self.replays += 1
            for scaling, snapshot in zip(self.scalings, scales):
                scaling.restore(snapshot)
            self.restore_rng(rng)
            self.batches.rewind()
            if self.rerun is not None:
                self.rerun.discard_run()
            self.monitor.begin_replay()
