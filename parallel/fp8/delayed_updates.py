"""Delayed scaling's amax reduction and scale update, once per pass for every linear of the pass, as TransformerEngine
does at the end of an fp8_autocast region: one max all-reduce of every recorded amax and a few batched updates. A max is
exact in any order, so the scales match per-cast updates bit for bit."""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional, Sequence

import torch

from parallel.fp8.fused import fused_region
from parallel.fp8.recipes import FP8_MAX, DelayedScaling, delayed_scale

FORWARD, BACKWARD = "forward", "backward"


@fused_region
def _newest_amaxes(histories: list) -> torch.Tensor:
    return torch.stack([history[0] for history in histories])


@fused_region
def _update_from_amaxes(histories: list, scales: list, newest: Optional[torch.Tensor], dtype: torch.dtype, margin: int,
                        most_recent: bool, replace_scales: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """TE's fused amax and scale update for every linear at once. Returns the new histories for the caller to write back
    (inductor mis-compiles a rolled tensor written into its inputs), and new scales where `replace_scales`."""
    history = torch.stack(histories)
    if newest is None:
        newest = history[:, 0].clone()
    history[:, 0] = newest
    amax = newest if most_recent else history.amax(dim=1)
    if history.size(1) > 1:
        history = torch.roll(history, -1, 1)
    history[:, 0] = 0.0
    updated = delayed_scale(amax, torch.stack(scales), FP8_MAX[dtype], margin)
    if replace_scales:
        return history, updated
    torch._foreach_copy_(scales, list(updated.unbind(0)))
    return history, None


def update_delayed_scales(scalings: Sequence[DelayedScaling], which: str,
                          reduce_amax: Optional[Callable[[torch.Tensor], None]] = None, fused: bool = False) -> None:
    """Reduce the amaxes recorded in this pass (`which`: FORWARD or BACKWARD roles) and update histories and scales in
    one collective."""
    if not scalings:
        return
    recipe = scalings[0].recipe
    if which == FORWARD:
        histories = [scaling.forward_history for scaling in scalings]
        scales = [scaling.forward_scale for scaling in scalings]
        dtype = recipe.forward_dtype
    else:
        histories = [scaling.backward_history for scaling in scalings]
        scales = [scaling.backward_scale for scaling in scalings]
        dtype = recipe.backward_dtype
    newest = None
    if reduce_amax is not None:
        newest = _newest_amaxes(histories, fused=fused)
        reduce_amax(newest)
    history, updated = _update_from_amaxes(histories, scales, newest, dtype, recipe.margin,
                                           recipe.amax_compute_algo != "max", which == FORWARD, fused=fused)
    torch._foreach_copy_(histories, list(history.unbind(0)))
    if which == FORWARD:  # replaced, not written: a compiled backward may still read the old
        for scaling, scale in zip(scalings, updated.unbind(0)):
            scaling.forward_scale = scale


class _AfterBackward(torch.autograd.Function):
    """The identity; its backward calls `done` once its output's gradient is complete."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, done: Callable[[], None]) -> torch.Tensor:
        ctx.done = done
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.done()
        return grad, None


class DelayedScalingPasses:
    """A model's delayed-scaling linears by the part a pass runs, updated once per pass: `forward_done` after a forward,
    `mark_backward` for the backward."""

    def __init__(self, groups: dict[Hashable, list[DelayedScaling]],
                 reduce_amax: Optional[Callable[[torch.Tensor], None]] = None, fused: bool = False) -> None:
        self.groups, self.reduce_amax, self.fused = groups, reduce_amax, fused

    def _scalings(self, parts: Iterable[Hashable]) -> list[DelayedScaling]:
        return [scaling for part in parts for scaling in self.groups.get(part, [])]

    def forward_done(self, parts: Iterable[Hashable]) -> None:
        update_delayed_scales(self._scalings(parts), FORWARD, self.reduce_amax, self.fused)

    def mark_backward(self, hidden: torch.Tensor, parts: Iterable[Hashable]) -> torch.Tensor:
        """Mark `hidden`, the first part's input: once its gradient is complete the output-gradient scales move."""
        if not (torch.is_grad_enabled() and hidden.requires_grad):
            return hidden
        scalings = self._scalings(parts)
        if not scalings:
            return hidden
        return _AfterBackward.apply(hidden, lambda: update_delayed_scales(scalings, BACKWARD, self.reduce_amax,
                                                                                 self.fused))
