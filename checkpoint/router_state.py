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
"""

from __future__ import annotations

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


def restore_expert_biases(model: nn.Module, saved: Optional[dict[str, list[float]]], device: torch.device,
                          where: str) -> list[str]:
    """Put the saved biases into this rank's routers that use one (their token counts zero, as between
    iterations); returns the names of those routers the checkpoint holds no bias for (they start at 0). A bias
    of another length is refused, naming `where` (the checkpoint): it would route as another model."""
    saved = saved or {}
    missing = []
    for name, module in model.named_modules():
        if not isinstance(module, TopKRouter) or not module.settings.router_enable_expert_bias:
            continue
        values = saved.get(name + SUFFIX)
        if values is None:
            missing.append(name + SUFFIX)
            continue
        if len(values) != module.settings.num_experts:
            raise CheckpointError(f"{where}: its {name + SUFFIX} holds {len(values)} values; this router has "
                                  f"{module.settings.num_experts} experts (--num-experts), one value each")
        module.expert_bias = torch.tensor(values, dtype=torch.float32, device=device)
        module.local_tokens_per_expert = torch.zeros_like(module.expert_bias)
    return missing
