"""Which checkpoint a diverged run can restart from: the newest save whose next loss was still in trend (not above
TREND_FACTOR x the lowest so far), since weights go bad a step or more before the loss does, so `latest` is not the last
good checkpoint."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from checkpoint.format import has_checkpoint, iteration_dir_name

TREND_FACTOR = 2.0  # a loss above twice the run's lowest is going up, not noise


@dataclass
class DivergenceHistory:
    """What the loop knew when it stopped: its start, every loss since, and the iterations it saved."""
    start_iteration: int
    losses: list[float]
    saved_iterations: list[int] = field(default_factory=list)

    def left_trend_at(self) -> int:
        """The first iteration of the final stretch of out-of-trend losses."""
        out_of_trend = []
        lowest = math.inf
        for loss in self.losses:
            out_of_trend.append(not math.isfinite(loss) or loss > TREND_FACTOR * lowest)
            if math.isfinite(loss):
                lowest = min(lowest, loss)
        out_of_trend[-1] = True  # the iteration that stopped the run
        first = len(out_of_trend) - 1
        while first > 0 and out_of_trend[first - 1]:
            first -= 1
        return self.start_iteration + 1 + first

    def resumable_iteration(self) -> Optional[int]:
        """The newest saved (or loaded) iteration whose next loss was in trend, or None."""
        left = self.left_trend_at()
        candidates = [k for k in self.saved_iterations if k + 1 < left]
        if self.start_iteration > 0 and self.start_iteration + 1 < left:
            candidates.append(self.start_iteration)
        return max(candidates, default=None)


def resumable_checkpoint(history: Optional[DivergenceHistory], save_dir: Optional[str], loaded: Optional[Path]) -> str:
    """Where a diverged run can restart from, in words."""
    if history is None:
        return "no checkpoint is known to resume"
    left, iteration = history.left_trend_at(), history.resumable_iteration()
    why = f"the losses left their trend at iteration {left}"
    if iteration is not None and iteration == history.start_iteration and loaded is not None:
        return f"{why}; the last checkpoint before that is {loaded} (the one this run loaded)"
    candidate = Path(save_dir) / iteration_dir_name(iteration) if iteration is not None and save_dir else None
    if candidate is not None and has_checkpoint(candidate):  # --keep-last may have pruned it
        return f"{why}; the last checkpoint before that is {candidate}: resume it with --load {candidate}"
    return f"{why}; no checkpoint saved before that is kept, so start again (with a lower --lr)"
