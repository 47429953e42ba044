"""Megatron-LM's checks of each micro-batch's loss for the rerun state machine (pretrain_gpt.py loss_func: NaN and
Inf, fatal, unless --no-check-for-nan-in-loss-and-grad; with --check-for-spiky-loss a loss SPIKY_LOSS_FACTOR times
the largest of the first 100, not fatal), made once after an iteration's micro-batches rather than inside each.

Why after: a check reads the loss back to the host, and a read inside a micro-batch makes the host wait for the
device there, which a CUDA graph cannot hold and which stalls the queue of kernels without one (issue 76 item 2).
Each micro-batch's loss stays on the device; `validate` reads them all in one copy and hands each to the machine.

Why the outcome is Megatron-Core's (megatron/core/rerun_state_machine.py, which validates inside loss_func, per
micro-batch): the machine gets the same values (the same float of each micro-batch's own mean) in the same
sequence of calls (per micro-batch, NaN then Inf then spiky), so each call's number (message, count), every
rejection, injected error, maximum seen, tracker line and verdict is the same. Nothing between two micro-batches
reads what validate_result decides: its flags (a re-run requested, a checkpoint, go on) are read by
should_run_forward_backward and should_checkpoint_and_exit, both after the last micro-batch and after `validate`;
and it raises nothing in the modes that validate (Megatron raises only with the machine disabled, where no checks
are made here and the step's own check stops a non-finite loss). The injector draws from Python's generator, which
no micro-batch draws from, so its draws are the same too. Only the machine's log lines come after the iteration's
micro-batches instead of between them.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from resilience.rerun_state import SPIKY_LOSS_FACTOR, RerunStateMachine


class LossChecks:
    """One iteration's micro-batch losses, kept on the device (`keep`) and validated together (`validate`)."""

    def __init__(self, rerun: Optional[RerunStateMachine], check_nan: bool, check_spiky: bool) -> None:
        self.rerun = rerun if rerun is not None and rerun.enabled else None
        self.check_nan, self.check_spiky = check_nan, check_spiky
        self._losses: list[torch.Tensor] = []
        self._scales: list[int] = []

    def start(self) -> None:
        """Before a run (or re-run) of the iteration's micro-batches."""
        self._losses, self._scales = [], []

    def keep(self, loss: torch.Tensor, accumulation_steps: int) -> None:
        """A micro-batch's loss (divided by `accumulation_steps`), on this rank before the data-parallel average."""
        if self.rerun is not None:
            self._losses.append(loss.detach())
            self._scales.append(accumulation_steps)

    def validate(self) -> None:
        """After the micro-batches: every kept loss read back in one copy, each checked in micro-batch order."""
        if self.rerun is None or not self._losses:
            return
        rerun = self.rerun
        for loss, scale in zip(torch.stack(self._losses).tolist(), self._scales):
            value = loss * scale  # the micro-batch's own mean, whatever the accumulation
            if self.check_nan:
                rerun.validate_result(value, math.isnan, "found NaN in local forward loss calculation")
                rerun.validate_result(value, math.isinf, "found Inf in local forward loss calculation")
            if self.check_spiky:
                rerun.validate_result(value, lambda v: rerun.is_unexpectedly_large(v, SPIKY_LOSS_FACTOR, "loss"),
                                      "Spiky loss", fatal=False)
        self.start()
