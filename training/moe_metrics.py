"""The MoE layers' side of an iteration: the balancing losses' backward scale (the main loss's), the expert-bias update
after backward, and the losses logged as Megatron-Core's MoEMetricsTracker reports them (summed over the TP and CP
slices, averaged over layers and DP), beside the LM loss, never added to it."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from gpt.moe.balancing import MOE_LOSS_NAMES, SUMMED_OVER_LAYERS
from gpt.moe.router import TopKRouter
from parallel.state import ParallelState


def begin_moe_iteration(model: nn.Module, loss_scale, accumulation_steps: int = 1, context_parallel_size: int = 1,
                        per_token: bool = False) -> None:
    """Set the balancing losses' backward scale to the main loss's."""
    tracker = getattr(model, "moe_tracker", None)
    if tracker is not None:
        tracker.begin_iteration(loss_scale if per_token else loss_scale * context_parallel_size / accumulation_steps,
                                per_token=per_token)


def finish_moe_iteration(model: nn.Module, state: ParallelState, accumulation_steps: int) -> dict[str, float]:
    """Update the expert biases; returns the MoE losses to log (the same on every rank)."""
    tracker = getattr(model, "moe_tracker", None)
    if tracker is None:
        return {}
    for module in model.modules():
        if isinstance(module, TopKRouter):
            module.update_expert_bias()
    sums = tracker.sums()
    # every name in one order: a stage without MoE layers joins the same collectives
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
    """Per layer, the balancing losses and the tokens per expert (--moe-per-layer-logging); every rank calls it."""
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
    """`values` summed in place over TP and CP (DeepSpeed-MoE's moe_loss averaged over CP)."""
    for size, group, name in ((state.tensor_parallel_size, state.tensor_parallel_group, "tp"),
                              (state.context_parallel_size, state.context_parallel_group, "cp")):
        if size > 1:
            state.comm.all_reduce(values, group, name)
    if losses and state.context_parallel_size > 1:
        for name in SUMMED_OVER_LAYERS:  # moe_loss: not a share
            values[MOE_LOSS_NAMES.index(name)] /= state.context_parallel_size
    return values


def _data_parallel_divisors(state: ParallelState, like: torch.Tensor) -> torch.Tensor:
    """Per loss, the divisor of the DP sum: DP, except for the global aux loss."""
    divisors = torch.full((len(MOE_LOSS_NAMES),), float(state.data_parallel_size), dtype=like.dtype,
                          device=like.device)
    divisors[MOE_LOSS_NAMES.index("global_load_balancing_loss")] = 1.0
    return divisors
