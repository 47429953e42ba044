"""The routers' expert bias in checkpoints (aux-loss-free balancing, --moe-router-enable-expert-bias).

Megatron-Core's TopKRouter keeps `expert_bias` as a persistent buffer (saved with the model's state) and
`local_tokens_per_expert` as a non-persistent one (megatron/core/transformer/moe/router.py, Router.__init__:
`register_buffer(..., persistent=False)`): the counts are summed over one iteration and zeroed after the bias
update (moe_utils.get_updated_expert_bias, called from finalize_model_grads), so between iterations, where a
save happens, they are zero. Here the same: each router's fp32 bias is saved by name (the router's global module
name + ".expert_bias") in the checkpoint's metadata, as exact fp32 values (a float32 goes to JSON as the double
it is and back without loss), and a resume puts it back with zero counts. The bias is the same on every rank
(the counts are summed over the data-parallel group before each update), one vector of --num-experts floats per
MoE layer.

A saved bias is checked as every tensor is, before any weight is loaded (`check_expert_biases`): one value per
expert, finite (it only chooses experts, so a NaN would never make the loss diverge: it would route wrongly without a
word), and present for every router the run routes with, where the format saves it (a resume; a --finetune or a
format that never holds one starts it at 0, said in a note).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from base.errors import CheckpointError
from gpt.moe.router import TopKRouter

SUFFIX = ".expert_bias"


def expert_biases(model: nn.Module) -> dict[str, list[float]]:
    """{router name + ".expert_bias": its values} for this rank's routers that hold a bias (made on the first
    forward: a model that has not run yet has none)."""
    return {name + SUFFIX: module.expert_bias.detach().cpu().tolist() for name, module in model.named_modules()
            if isinstance(module, TopKRouter) and module.expert_bias is not None}


def biased_routers(model: nn.Module) -> dict[str, int]:
    """{router name + ".expert_bias": its number of experts} of this rank's routers that route with a bias."""
    return {name + SUFFIX: module.settings.num_experts for name, module in model.named_modules()
            if isinstance(module, TopKRouter) and module.settings.router_enable_expert_bias}


def configured_biased_routers(model_config) -> dict[str, int]:
    """`biased_routers` of the model `model_config` (a ModelConfig) builds, without building it: each MoE block's
    router and, where the MTP layers are MoE layers (Megatron-Core builds them as the last decoder layer's kind), each
    MTP layer's."""
    moe = model_config.moe
    if moe is None or not moe.router_enable_expert_bias:
        return {}
    counts = model_config.experts_per_layer()
    routers = {f"blocks.{layer}.mlp.router{SUFFIX}": count for layer, count in enumerate(counts) if count > 1}
    if counts[-1] > 1:
        routers.update({f"mtp_layers.{depth}.transformer_layer.mlp.router{SUFFIX}": counts[-1]
                        for depth in range(model_config.mtp.num_layers)})
    return routers


def _as_vector(values, name: str, where: str) -> torch.Tensor:
    try:
        return torch.tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise CheckpointError(f"{where}: its {name} is not a list of numbers") from None


def check_expert_biases(saved: Optional[dict], wanted: dict[str, int], where: str, required: bool) -> list[str]:
    """Each bias of `wanted` (biased_routers) that `saved` holds has one finite value per expert, else one line
    naming the tensor and both shapes, or the bad value; a router `saved` lacks is refused where `required` (the
    format saves every router's bias, and the run resumes), else returned (it starts at 0). `where`: the checkpoint."""
    saved = saved or {}
    missing = []
    for name, experts in wanted.items():
        values = saved.get(name)
        if values is None:
            if required:
                raise CheckpointError(
                    f"{where}: holds no {name}, and this run routes with it (--moe-router-enable-expert-bias): a "
                    f"checkpoint saved without the flag resumes without it, or with --finetune (the bias from 0)")
            missing.append(name)
            continue
        vector = _as_vector(values, name, where)
        if tuple(vector.shape) != (experts,):
            raise CheckpointError(f"{where}: its {name} is {list(vector.shape)}; this router has {experts} experts "
                                  f"(--num-experts), one value each: [{experts}]")
        bad = next((index for index, value in enumerate(vector.tolist()) if not math.isfinite(value)), None)
        if bad is not None:
            raise CheckpointError(f"{where}: its {name} holds {vector[bad].item()} at expert {bad}: an expert bias "
                                  f"must be finite (it chooses the experts; the loss would not show the damage)")
    return missing


def restore_expert_biases(model: nn.Module, saved: Optional[dict], device: torch.device) -> None:
    """Put the saved biases (checked: check_expert_biases) into this rank's routers that use one, their token counts
    zero, as between iterations; a router without a saved bias keeps its own (0 from its first forward)."""
    saved = saved or {}
    for name, module in model.named_modules():
        if not isinstance(module, TopKRouter) or not module.settings.router_enable_expert_bias:
            continue
        values = saved.get(name + SUFFIX)
        if values is not None:
            module.expert_bias = torch.tensor(values, dtype=torch.float32, device=device)
            module.local_tokens_per_expert = torch.zeros_like(module.expert_bias)
