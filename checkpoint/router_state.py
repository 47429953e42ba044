"""The routers' expert bias in checkpoints (--moe-router-enable-expert-bias): as Megatron-Core's TopKRouter, the bias is
persistent and the token counts are not (zero between iterations). Each fp32 bias is saved by router name in the
metadata, checked (one finite value per expert) before any weight loads, and restored with zero counts.
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
    """{router name + ".expert_bias": its values} for this rank's routers holding a bias (made on the first forward)."""
    return {name + SUFFIX: module.expert_bias.detach().cpu().tolist() for name, module in model.named_modules()
            if isinstance(module, TopKRouter) and module.expert_bias is not None}


def biased_routers(model: nn.Module) -> dict[str, int]:
    """{router name + ".expert_bias": its number of experts} of this rank's routers that route with a bias."""
    return {name + SUFFIX: module.settings.num_experts for name, module in model.named_modules()
            if isinstance(module, TopKRouter) and module.settings.router_enable_expert_bias}


def configured_biased_routers(model_config) -> dict[str, int]:
    """`biased_routers` of the model `model_config` builds, without building it (MoE MTP layers included)."""
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
    """Each saved bias in `wanted` has one finite value per expert, else one line; a missing router is refused where
    `required`, else returned (it starts at 0)."""
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
    """Put the saved biases into this rank's routers, counts zero; a router without one keeps its own."""
    saved = saved or {}
    for name, module in model.named_modules():
        if not isinstance(module, TopKRouter) or not module.settings.router_enable_expert_bias:
            continue
        values = saved.get(name + SUFFIX)
        if values is not None:
            module.expert_bias = torch.tensor(values, dtype=torch.float32, device=device)
            module.local_tokens_per_expert = torch.zeros_like(module.expert_bias)
