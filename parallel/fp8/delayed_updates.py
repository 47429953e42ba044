"""Delayed scaling's amax reduction and scale update, once per pass for every linear of the pass, as
TransformerEngine does at the end of an fp8_autocast region (transformer_engine/pytorch/quantization.py,
reduce_and_update_fp8_tensors): the amaxes the pass's casts recorded (parallel/fp8/recipes.py, DelayedScaling) go
into one buffer, one all-reduce (max) over the run's amax reduction group takes it, and every history rolls and
every scale is computed from it in a few batched operations.

Megatron-Core enters one autocast around a micro-batch's forward over a model chunk's blocks and TE updates the
backward's scales when that backward ends, so here a chunk's forward ends with `forward_done` and its blocks'
backward with the boundary `mark_backward` puts at their input. Each role is cast once in a pass, so the scales are
those an update right after each cast would give, bit for bit (a max is exact in any order).

Over several ranks Megatron-Core reduces over get_amax_reduction_group(with_context_parallel=True), the TP x DP (x
CP) ranks of a stage (fp8_utils.py get_fp8_context): `reduce_amax` here (a max all-reduce; None in one process).
After it a weight shard's amax is the whole weight's and every rank of the group holds the same histories and
scales. The buffer holds each rank's linears in one order (its modules, then each expert by local index), so under
EP an expert's amax is reduced with the experts at the same local index on the other EP ranks, as TE's buffer is
reduced by position. Nothing here runs inside a compiled block (docs/fp8.md, "Under --compile"); with
--fp8-fused-casts the work around the collective is two compiled regions (TE's fused amax and scale update)."""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional, Sequence

import torch

from parallel.fp8.fused import fused_region
from parallel.fp8.recipes import FP8_MAX, DelayedScaling, delayed_scale

FORWARD, BACKWARD = "forward", "backward"


@fused_region
def _newest_amaxes(histories: list) -> torch.Tensor:
    """Every linear's newest history row, [linears, roles]: the buffer the collective reduces."""
    return torch.stack([history[0] for history in histories])


@fused_region
def _update_from_amaxes(histories: list, scales: list, newest: Optional[torch.Tensor], dtype: torch.dtype, margin: int,
                        most_recent: bool, replace_scales: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """TE's amax and scale update after the reduction (fused_amax_and_scale_update_after_reduction), every linear
    at once: `newest` (the reduced row 0s; None: the histories' own) into row 0, the amax, the roll, row 0 zeroed,
    the scales. Returns the new histories [linears, history_len, roles], for the caller to write back (inductor 2.13
    mis-compiles a rolled tensor written into the inputs it was rolled from: zeros), and the new scales where
    `replace_scales`, else writes them in place (each scale from its own old value: no such hazard)."""
    history = torch.stack(histories)  # [linears, history_len, roles]
    if newest is None:
        newest = history[:, 0].clone()  # kept apart from the row zeroed below
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
    """Reduce the amaxes `scalings` recorded in this pass (`which`: FORWARD for the input and weight roles,
    BACKWARD for the output gradient's) and update their histories and scales: one collective between at most two
    regions (parallel/fp8/fused.py; `fused`: compiled) and the histories' write-back, whatever the number of
    linears."""
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
    if reduce_amax is not None:  # the collective stays outside the compiled regions
        newest = _newest_amaxes(histories, fused=fused)
        reduce_amax(newest)
    history, updated = _update_from_amaxes(histories, scales, newest, dtype, recipe.margin,
                                           recipe.amax_compute_algo != "max", which == FORWARD, fused=fused)
    torch._foreach_copy_(histories, list(history.unbind(0)))
    if which == FORWARD:  # replaced, not written: a compiled backward may still read the old (recipes.py says why)
        for scaling, scale in zip(scalings, updated.unbind(0)):
            scaling.forward_scale = scale


class _AfterBackward(torch.autograd.Function):
    """The identity; its backward calls `done` once the gradient of its output is complete, i.e. after the
    backward of every layer that consumed it."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, done: Callable[[], None]) -> torch.Tensor:
        ctx.done = done
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.done()
        return grad, None


class DelayedScalingPasses:
    """A model's delayed-scaling linears by the part of it a pass runs (`groups`: a model chunk's blocks, the
    multi-token prediction layers), updated once per pass: `forward_done` after a forward over some parts, and,
    for the backward, `mark_backward` on the input of the first of them. None of it without delayed scaling."""

    def __init__(self, groups: dict[Hashable, list[DelayedScaling]],
                 reduce_amax: Optional[Callable[[torch.Tensor], None]] = None, fused: bool = False) -> None:
        self.groups, self.reduce_amax, self.fused = groups, reduce_amax, fused

    def _scalings(self, parts: Iterable[Hashable]) -> list[DelayedScaling]:
        return [scaling for part in parts for scaling in self.groups.get(part, [])]

    def forward_done(self, parts: Iterable[Hashable]) -> None:
        """A forward over `parts` ended (training or evaluation): their input and weight scales move."""
        update_delayed_scales(self._scalings(parts), FORWARD, self.reduce_amax, self.fused)

    def mark_backward(self, hidden: torch.Tensor, parts: Iterable[Hashable]) -> torch.Tensor:
        """`hidden`, the input of the first of `parts` in the forward now starting; once its gradient is complete
        (every one of their layers ran its backward), their output-gradient scales move. Without autograd (an
        evaluation) there is no backward to mark."""
        if not (torch.is_grad_enabled() and hidden.requires_grad):
            return hidden
        scalings = self._scalings(parts)
        if not scalings:
            return hidden
        return _AfterBackward.apply(hidden, lambda: update_delayed_scales(scalings, BACKWARD, self.reduce_amax,
                                                                                 self.fused))
