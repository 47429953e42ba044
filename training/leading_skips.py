"""One line for an fp16 run whose first iterations all skip for gradient overflow: Megatron-LM's dynamic loss scale
starts at 2**32, so a short launch can skip every step. It says once why and which flag changes it, for runs that start
from the initial dynamic scale."""

from __future__ import annotations

import math
from typing import Optional

MEGATRON_INITIAL_LOSS_SCALE = 2.0 ** 32  # Megatron-LM's --initial-loss-scale default


def scale_words(scale: float) -> str:
    """A loss scale as a flag's value (with its power of two)."""
    exponent = math.log2(scale) if scale > 0 else None
    power = f" (2^{int(exponent)}" if exponent is not None and exponent == int(exponent) else ""
    megatron = ", Megatron-LM's default" if scale == MEGATRON_INITIAL_LOSS_SCALE else ""
    return f"{scale:.0f}{power}{megatron})" if power else f"{scale:g}"


def descent_words(initial_scale: float, hysteresis: int) -> str:
    """How the dynamic scale came down, in its flags' terms."""
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
        """The watcher for a fresh fp16 run with dynamic scaling; None otherwise."""
        if not training.mixed_precision.fp16 or training.mixed_precision.loss_scale is not None or start_iteration > 0:
            return None
        return cls(training.mixed_precision.initial_loss_scale, training.mixed_precision.hysteresis, start_iteration + 1)

    def after(self, iteration: int, skipped: bool, scale_after: float) -> Optional[str]:
        """The line, once, at the first step taken after skipped ones."""
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
        """The line where every iteration trained was skipped."""
        if self.stepped or not self.skipped:
            return None
        return (f"> {self._span()} all skipped for fp16 gradient overflow, no optimizer step taken: "
                f"{descent_words(self.initial_scale, self.hysteresis)}, and it is {scale_words(self.scale)} now; "
                f"give a lower --initial-loss-scale (or a static --loss-scale), or train more iterations")

    def _span(self) -> str:
        last = self.first_iteration + self.skipped - 1
        return f"iteration {last}" if last == self.first_iteration else f"iterations {self.first_iteration}-{last}"
