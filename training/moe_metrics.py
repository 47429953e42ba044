"""The MoE layers' side of a training iteration (gpt/moe/): before the micro-batches, the balancing losses'
backward scale (the main loss's: the fp16 loss scale over the micro-batches, as Megatron-Core's
schedules.forward_step sets MoEAuxLossAutoScaler's); after backward, the expert-bias update (Megatron-Core's
finalize_model_grads -> _update_router_expert_bias) and the values to log.

Logged as Megatron-Core's MoEMetricsTracker.report does: per loss (load_balancing_loss, seq_load_balancing_loss,
global_load_balancing_loss, z_loss; each the loss over its coefficient), summed over the micro-batches times
1 / micro-batches, summed over the MoE layers and divided by their number, averaged over the data-parallel group.
They are logged beside the LM loss, never added to it.
"""

from __future__ import annotations

import torch
from torch import nn

from gpt.moe.balancing import MOE_LOSS_NAMES
from gpt.moe.router import TopKRouter
from parallel.state import ParallelState


def begin_moe_iteration(model: nn.Module, loss_scale: float, accumulation_steps: int) -> None:
    tracker = getattr(model, "moe_tracker", None)
    if tracker is not None:
        tracker.begin_iteration(loss_scale / accumulation_steps)


def finish_moe_iteration(model: nn.Module, state: ParallelState, accumulation_steps: int) -> dict[str, float]:
    """Update the expert biases; the iteration's MoE losses to log (every rank gets the same values)."""
    tracker = getattr(model, "moe_tracker", None)
    if tracker is None:
        return {}
    for module in model.modules():
        if isinstance(module, TopKRouter):
            module.update_expert_bias()
    sums = tracker.sums()
    # Every name, recorded or not, in one fixed order: a pipeline stage without MoE layers (--moe-layer-freq) joins
    # the same collectives as the others, with zero counts.
    totals = torch.tensor([[sum(sums.get(name, {}).values()), len(sums.get(name, {}))] for name in MOE_LOSS_NAMES],
                          dtype=torch.float64, device=state.device)
    if state.pipeline_parallel_size > 1:
        state.comm.all_reduce(totals, state.pipeline_parallel_group, "pp")
    if state.data_parallel_size > 1:
        counts = totals[:, 1].clone()
        state.comm.all_reduce(totals, state.data_parallel_group, "dp")
        totals[:, 1] = counts
        totals[:, 0] /= state.data_parallel_size
    return {name: float(total / count / accumulation_steps)
            for name, (total, count) in zip(MOE_LOSS_NAMES, totals.tolist()) if count > 0}
