"""--fp8-guard's iteration replay: where a layer running in FP8 failed the guard's check on any rank, the iteration runs
again from its starting state (batches, RNG, delayed-scaling state) with the failed layers in high precision. Each
replay adds a layer, so it ends."""

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
        self.replays = 0  # how many iterations ran again (tests read it)

    def run(self, passes: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`passes()`: the iteration's micro-batches from zeroed gradients; returns their loss on the device."""
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
