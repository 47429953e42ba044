"""`--moe-router-topk-limited-devices N`, Megatron-Core's deprecated name for device-limited routing: as its
TransformerConfig does, it becomes --moe-router-group-topk N over --moe-router-num-groups = the expert-parallel size,
said once; on a dense model it has no effect."""

from __future__ import annotations

from typing import Any, Optional

from arguments.config_sources import FLAG, Source
from gpt.moe.settings import largest_expert_count

FLAG_NAME = "--moe-router-topk-limited-devices"


def apply_limited_devices(settings: dict[str, Any], sources: dict[str, Source]) -> tuple[Optional[str], Optional[str]]:
    """(problem, note): the flag's value moved into the two group-routing settings, or why it cannot be."""
    devices = settings.get("moe_router_topk_limited_devices")
    if devices is None:
        return None, None
    settings["moe_router_topk_limited_devices"] = None
    if largest_expert_count(settings.get("num_experts")) is None:
        return None, f"> {FLAG_NAME} {devices}: no effect on a dense model (no --num-experts)"
    if settings.get("moe_router_group_topk"):
        return (f"{FLAG_NAME} {devices} with --moe-router-group-topk: Megatron-Core raises \"moe_router_topk_limited_"
                f"devices is deprecated and replaced by moe_router_group_topk and moe_router_num_groups\"; give "
                f"only the group flags", None)
    expert_parallel = settings.get("expert_model_parallel_size") or 1
    settings["moe_router_group_topk"], settings["moe_router_num_groups"] = devices, expert_parallel
    given = Source(FLAG, FLAG_NAME, note="Megatron-Core's deprecated name for device-limited routing")
    sources["moe_router_group_topk"] = sources["moe_router_num_groups"] = given
    return None, (f"> {FLAG_NAME} {devices}: deprecated in Megatron-Core, which routes as --moe-router-num-groups "
                  f"{expert_parallel} (the expert-parallel ranks) --moe-router-group-topk {devices}; so here")
