"""The MoE layers' side of a training iteration (gpt/moe/): before the micro-batches, the balancing losses'
backward scale (the main loss's: the fp16 loss scale over the micro-batches, as Megatron-Core's
schedules.forward_step sets MoEAuxLossAutoScaler's); after backward, the expert-bias update (Megatron-Core's
finalize_model_grads -> _update_router_expert_bias) and the values to log.

Logged as Megatron-Core's MoEMetricsTracker.report does: per loss (load_balancing_loss, seq_load_balancing_loss,
global_load_balancing_loss, z_loss; each the loss over its coefficient), summed over the micro-batches times
1 / micro-batches, summed over the MoE layers and divided by their number, averaged over the data-parallel group;
DeepSpeed-MoE's moe_loss (l_aux x --moe-loss-coeff) summed over the layers, as Megatron-DeepSpeed logs it.
Under tensor parallelism each TP rank's router records its sequence slice's share (gpt/moe/router.py), and the
shares and token counts are summed over the TP group first (Megatron-Core records the balancing losses with
reduce_group = tp_cp_group, and averages the z-loss, whose shares here carry 1/TP, over it).
They are logged beside the LM loss, never added to its value (only their gradients are).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from gpt.moe.balancing import MOE_LOSS_NAMES, SUMMED_OVER_LAYERS
from gpt.moe.router import TopKRouter
from parallel.state import ParallelState


def begin_moe_iteration(model: nn.Module, loss_scale: float, accumulation_steps: int) -> None:
    tracker = getattr(model, "moe_tracker", None)
    if tracker is not None:
        tracker.begin_iteration(loss_scale / accumulation_steps)


def finish_moe_iteration(model: nn.Module, state: ParallelState, accumulation_steps: int) -> dict[str, float]:
    """Update the expert biases; the iteration's MoE losses to log (every rank gets the same values). With
    --moe-per-layer-logging, `moe_per_layer_values` gives the same per layer."""
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
    if state.tensor_parallel_size > 1:
        shares = totals[:, 0].clone()
        state.comm.all_reduce(shares, state.tensor_parallel_group, "tp")
        totals[:, 0] = shares
    if state.pipeline_parallel_size > 1:
        state.comm.all_reduce(totals, state.pipeline_parallel_group, "pp")
    if state.data_parallel_size > 1:
        counts = totals[:, 1].clone()
        state.comm.all_reduce(totals, state.data_parallel_group, "dp")
        totals[:, 1] = counts
        totals[:, 0] /= state.data_parallel_size
    return {name: float(total / (1 if name in SUMMED_OVER_LAYERS else count) / accumulation_steps)
            for name, (total, count) in zip(MOE_LOSS_NAMES, totals.tolist()) if count > 0}


def moe_per_layer_values(model: nn.Module, state: ParallelState, accumulation_steps: int, num_layers: int,
                         num_experts: int, experts_per_layer: Optional[Sequence[int]] = None) -> dict[str, list]:
    """Per layer (None where a layer has no experts): each balancing loss as finish_moe_iteration logs it, and
    the tokens each expert received in the iteration summed over the micro-batches, the TP slices and the
    data-parallel ranks (Megatron-LM's --moe-per-layer-logging). Call it after finish_moe_iteration, on every rank.
    `num_experts`: the most any layer has; `experts_per_layer`: each layer's, where they differ (a
    Megatron-DeepSpeed list)."""
    tracker = model.moe_tracker
    sums = tracker.sums()
    losses = torch.zeros(len(MOE_LOSS_NAMES), num_layers, dtype=torch.float64, device=state.device)
    present = torch.zeros_like(losses)
    for row, name in enumerate(MOE_LOSS_NAMES):
        for layer, value in sums.get(name, {}).items():
            losses[row, layer], present[row, layer] = value / accumulation_steps, 1.0
    tokens = torch.zeros(num_layers, num_experts, dtype=torch.float64, device=state.device)
    for layer, counts in tracker.tokens_per_expert.items():
        tokens[layer, :counts.numel()] = counts.to(tokens)
    if state.tensor_parallel_size > 1:  # each TP rank's sequence slice
        for tensor in (losses, tokens):
            state.comm.all_reduce(tensor, state.tensor_parallel_group, "tp")
    for group, name in ((state.pipeline_parallel_group, "pp"), (state.data_parallel_group, "dp")):
        if (state.pipeline_parallel_size if name == "pp" else state.data_parallel_size) > 1:
            for tensor in (losses, present, tokens):
                state.comm.all_reduce(tensor, group, name)
    present = present.clamp(max=1.0) if state.data_parallel_size == 1 else present / state.data_parallel_size
    losses = losses / state.data_parallel_size
    values = {name: [value if seen else None for value, seen in zip(losses[row].tolist(), present[row].tolist())]
              for row, name in enumerate(MOE_LOSS_NAMES) if present[row].any()}
    holds = [layer in tracker.tokens_per_expert for layer in range(num_layers)]
    held = torch.tensor(holds, dtype=torch.float64, device=state.device)
    if state.pipeline_parallel_size > 1:
        state.comm.all_reduce(held, state.pipeline_parallel_group, "pp")
    widths = list(experts_per_layer) if experts_per_layer is not None else [num_experts] * num_layers
    values["tokens_per_expert"] = [[int(count) for count in row[:width]] if flag else None
                                   for row, flag, width in zip(tokens.tolist(), held.tolist(), widths)]
    return values
