"""The MoE layers' side of a training iteration (gpt/moe/): before the micro-batches, the balancing losses' backward
scale (the main loss's: the fp16 loss scale over the micro-batches, as Megatron-Core's schedules.forward_step sets
MoEAuxLossAutoScaler's); after backward, the expert-bias update (finalize_model_grads -> _update_router_expert_bias)
and the values to log.

Logged as Megatron-Core's MoEMetricsTracker.report does: per loss (load_balancing_loss, seq_load_balancing_loss,
global_load_balancing_loss, z_loss; each over its coefficient), summed over the micro-batches times 1 /
micro-batches, averaged over the MoE layers and the DP group; DeepSpeed-MoE's moe_loss (l_aux x --moe-loss-coeff)
summed over the layers, as Megatron-DeepSpeed logs it. Under TP and CP each router records its slice's share
(gpt/moe/router.py), summed over the TP and CP groups first (Megatron-Core's reduce_group = tp_cp_group; the global
loss over tp_dp_cp_group with no DP average; the z-loss, whose shares carry 1/(TP x CP), averaged over
tp_dp_cp_group). The backward scale carries the CP size, as schedules.forward_step_calc_loss (`loss_scale *
cp_size_for_scaling / num_microbatches`): each CP rank's LM loss is its chunks' share x CP and gradients are
averaged over DP x CP, so the shares' gradients carry CP too. DeepSpeed-MoE's moe_loss is each rank's own, logged as
its mean over CP, its gradient the sum over the CP ranks (as under Ulysses, where DeepSpeed divides gradients by DP
only). They are logged beside the LM loss, never added to its value (only their gradients are)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from gpt.moe.balancing import MOE_LOSS_NAMES, SUMMED_OVER_LAYERS
from gpt.moe.router import TopKRouter
from parallel.state import ParallelState


def begin_moe_iteration(model: nn.Module, loss_scale, accumulation_steps: int = 1, context_parallel_size: int = 1,
                        per_token: bool = False) -> None:
    """The balancing losses' backward scale: the main loss's. `per_token` (--calculate-per-token-loss): `loss_scale`
    is already the main loss's whole scale (the iteration's token scale, training/per_token_loss.py), and each loss
    is multiplied by the tokens its router saw (gpt/moe/balancing.py attach)."""
    tracker = getattr(model, "moe_tracker", None)
    if tracker is not None:
        tracker.begin_iteration(loss_scale if per_token else loss_scale * context_parallel_size / accumulation_steps,
                                per_token=per_token)


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
    totals[:, 0] = _summed_over_slices(totals[:, 0].clone(), state, losses=True)
    if state.pipeline_parallel_size > 1:
        state.comm.all_reduce(totals, state.pipeline_parallel_group, "pp")
    if state.data_parallel_size > 1:
        counts = totals[:, 1].clone()
        state.comm.all_reduce(totals, state.data_parallel_group, "dp")
        totals[:, 1] = counts
        totals[:, 0] /= _data_parallel_divisors(state, totals)
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
    losses, tokens = _summed_over_slices(losses, state, losses=True), _summed_over_slices(tokens, state)
    for group, name in ((state.pipeline_parallel_group, "pp"), (state.data_parallel_group, "dp")):
        if (state.pipeline_parallel_size if name == "pp" else state.data_parallel_size) > 1:
            for tensor in (losses, present, tokens):
                state.comm.all_reduce(tensor, group, name)
    present = present.clamp(max=1.0) if state.data_parallel_size == 1 else present / state.data_parallel_size
    losses = losses / _data_parallel_divisors(state, losses)[:, None]
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


def _summed_over_slices(values: torch.Tensor, state: ParallelState, losses: bool = False) -> torch.Tensor:
    """`values` (with `losses`, rows in MOE_LOSS_NAMES' order; else token counts) summed over the TP and CP ranks'
    slices of the sequence (Megatron-Core's tp_cp reduce_group); DeepSpeed-MoE's moe_loss, each rank's own value,
    averaged over CP instead. In place."""
    for size, group, name in ((state.tensor_parallel_size, state.tensor_parallel_group, "tp"),
                              (state.context_parallel_size, state.context_parallel_group, "cp")):
        if size > 1:
            state.comm.all_reduce(values, group, name)
    if losses and state.context_parallel_size > 1:
        for name in SUMMED_OVER_LAYERS:  # moe_loss: not a share
            values[MOE_LOSS_NAMES.index(name)] /= state.context_parallel_size
    return values


def _data_parallel_divisors(state: ParallelState, like: torch.Tensor) -> torch.Tensor:
    """Per row of MOE_LOSS_NAMES, what the sum over the data-parallel ranks is divided by: DP (Megatron's
    needs_dp_avg), except the global aux loss, whose ranks' shares sum to the loss (_apply_global_aux_loss
    records it with `needs_dp_avg=False`)."""
    divisors = torch.full((len(MOE_LOSS_NAMES),), float(state.data_parallel_size), dtype=like.dtype,
                          device=like.device)
    divisors[MOE_LOSS_NAMES.index("global_load_balancing_loss")] = 1.0
    return divisors
