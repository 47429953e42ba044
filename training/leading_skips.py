"""One line for an fp16 run whose first iterations all skip for gradient overflow (issue 81 item 4).

Megatron-LM starts dynamic loss scaling at --initial-loss-scale, 2**32 by default, and its DynamicGradScaler
(megatron/core/optimizer/grad_scaler.py, `update`) keeps the scale for the first --hysteresis - 1 overflows and halves
it on each one after, every such step skipped (megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer.step:
`if found_inf_flag: return False, None, None`, no update). From 2**32 the gradients of a fresh model overflow for tens of iterations, so a short fp16 launch
(Zyphra's, AWS's test cases) skips every step, as it does under Megatron, where only each log line's "number of
skipped iterations" says so. Here every skip has its own line already (training/train_step.py); this says once why,
from where, and which flag changes it: at the first step taken after the skips, or at the end of a run that took none.
Only for a run that starts from the initial scale (iteration 1: a resumed run's scale is its checkpoint's) with
dynamic scaling (a static --loss-scale is the user's own).
"""

from __future__ import annotations

import math
from typing import Optional

MEGATRON_INITIAL_LOSS_SCALE = 2.0 ** 32  # megatron/training/arguments.py: --initial-loss-scale default=2**32


def scale_words(scale: float) -> str:
    """A loss scale as a flag's value, with its power of two where it is one (4294967296 (2^32))."""
    exponent = math.log2(scale) if scale > 0 else None
    power = f" (2^{int(exponent)}" if exponent is not None and exponent == int(exponent) else ""
    megatron = ", Megatron-LM's default" if scale == MEGATRON_INITIAL_LOSS_SCALE else ""
    return f"{scale:.0f}{power}{megatron})" if power else f"{scale:g}"


def descent_words(initial_scale: float, hysteresis: int) -> str:
    """How the dynamic scale came down, in the terms of the flags that set it."""
    kept = (f"keeps it for the first {hysteresis - 1} overflow{'s' if hysteresis > 2 else ''} (--hysteresis "
            f"{hysteresis}) and halves it on each one after") if hysteresis > 1 else \
        "halves it on each overflow (--hysteresis 1)"
    return f"dynamic loss scaling starts at --initial-loss-scale {scale_words(initial_scale)} and {kept}, " \
           f"as Megatron-LM's does"


class LeadingSkips:
    """Watches a run's first iterations: the skipped ones before its first optimizer step."""

    def __init__(self, initial_scale: float, hysteresis: int, first_iteration: int = 1) -> None:
        self.initial_scale, self.hysteresis, self.first_iteration = initial_scale, hysteresis, first_iteration
        self.skipped = 0
        self.stepped = False
        self.scale = initial_scale  # the scale the next step runs at

    @classmethod
    def of(cls, training, start_iteration: int) -> Optional["LeadingSkips"]:
        """The watcher for a run of `training` (TrainingConfig) resumed after `start_iteration` (0: from scratch);
        None where the line does not apply: not fp16, a static --loss-scale, or a resumed run."""
        if not training.mixed_precision.fp16 or training.mixed_precision.loss_scale is not None or start_iteration > 0:
            return None
        return cls(training.mixed_precision.initial_loss_scale, training.mixed_precision.hysteresis, start_iteration + 1)

    def after(self, iteration: int, skipped: bool, scale_after: float) -> Optional[str]:
        """After each iteration: the line, once, at the first step taken after skipped ones; None otherwise."""
        if self.stepped:
            return None
        if skipped:
            self.skipped += 1
            self.scale = scale_after
            return None
        self.stepped = True
        if not self.skipped:
            return None
        return (f"> {self._span()} skipped for fp16 gradient overflow before the first optimizer step, taken at "
                f"iteration {iteration} at loss scale {scale_words(self.scale)}: "
                f"{descent_words(self.initial_scale, self.hysteresis)}; give --initial-loss-scale "
                f"{self.scale:.0f} to start there")

    def at_end(self) -> Optional[str]:
        """At the end of the run: the line where every iteration it trained was skipped; None otherwise."""
        if self.stepped or not self.skipped:
            return None
        return (f"> {self._span()} all skipped for fp16 gradient overflow, no optimizer step taken: "
                f"{descent_words(self.initial_scale, self.hysteresis)}, and it is {scale_words(self.scale)} now; "
                f"give a lower --initial-loss-scale (or a static --loss-scale), or train more iterations")

    def _span(self) -> str:
        last = self.first_iteration + self.skipped - 1
        return f"iteration {last}" if last == self.first_iteration else f"iterations {self.first_iteration}-{last}"
