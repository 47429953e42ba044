"""Megatron-LM's loss checks for the rerun state machine (NaN, Inf, and with --check-for-spiky-loss a spike), made once
after an iteration's micro-batches: reading a loss inside one would make the host wait on the device. The machine gets
the same values in the same call order as Megatron's per-micro-batch checks, so its decisions are the same."""

from __future__ import annotations

import math
from typing import Optional

import torch

from resilience.rerun_state import SPIKY_LOSS_FACTOR, RerunStateMachine


class LossChecks:
    """One iteration's micro-batch losses, kept on the device and validated together."""

    def __init__(self, rerun: Optional[RerunStateMachine], check_nan: bool, check_spiky: bool) -> None:
        self.rerun = rerun if rerun is not None and rerun.enabled else None
        self.check_nan, self.check_spiky = check_nan, check_spiky
        self._losses: list[torch.Tensor] = []
        self._scales: list[int] = []

    def start(self) -> None:
        self._losses, self._scales = [], []

    def keep(self, loss: torch.Tensor, accumulation_steps: int) -> None:
        """A micro-batch's loss (divided by `accumulation_steps`), before the data-parallel average."""
        if self.rerun is not None:
            self._losses.append(loss.detach())
            self._scales.append(accumulation_steps)

    def validate(self) -> None:
        """Every kept loss read back in one copy, checked in micro-batch order."""
        if self.rerun is None or not self._losses:
            return
        rerun = self.rerun
        for loss, scale in zip(torch.stack(self._losses).tolist(), self._scales):
            value = loss * scale
            if self.check_nan:
                rerun.validate_result(value, math.isnan, "found NaN in local forward loss calculation")
                rerun.validate_result(value, math.isinf, "found Inf in local forward loss calculation")
            if self.check_spiky:
                rerun.validate_result(value, lambda v: rerun.is_unexpectedly_large(v, SPIKY_LOSS_FACTOR, "loss"),
                                      "Spiky loss", fatal=False)
        self.start()
