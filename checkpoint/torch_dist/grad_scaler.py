"""fp16's loss scaler in Megatron-LM's torch_dist checkpoints, both ways: Megatron-Core's DynamicGradScaler follows our
DynamicLossScaler's rule, so its state maps field for field (growth_tracker is good_steps, hysteresis_tracker
hysteresis_left); the constant scaler saves nothing.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from base.errors import CheckpointError

GRAD_SCALER = "grad_scaler"
DYNAMIC, STATIC = "DynamicLossScaler", "LossScaler"  # zero/loss_scaler.py's classes, as a shard names its scaler


def megatron_grad_scaler(scaler_type: str, state: dict) -> dict:
    """What Megatron-Core's grad scaler state_dict holds for this run's fp16 scaler."""
    if scaler_type == STATIC:
        return {}  # ConstantGradScaler: the scale is --loss-scale, the same flag on both sides
    return {"scale": torch.tensor([float(state["scale"])], dtype=torch.float32),
            "growth_tracker": int(state["good_steps"]), "hysteresis_tracker": int(state["hysteresis_left"])}


def our_scaler_state(saved: object, where: str) -> Optional[tuple[str, dict]]:
    """(our scaler's class name, its state) from Megatron-LM's grad scaler state; None for the constant scaler."""
    if saved == {}:
        return None
    try:
        scale = saved["scale"]
        scale = float(scale.reshape(-1)[0]) if isinstance(scale, torch.Tensor) else float(scale)
        state = {"scale": scale, "good_steps": int(saved["growth_tracker"]),
                 "hysteresis_left": int(saved["hysteresis_tracker"])}
    except (TypeError, KeyError, IndexError, ValueError, RuntimeError):
        state = None
    if state is None or not (math.isfinite(state["scale"]) and state["scale"] > 0):
        raise CheckpointError(f"{where}: common.pt's optimizer.{GRAD_SCALER} is not a loss scaler's state (a finite "
                              f"positive scale and two counters): {str(saved)[:120]}")
    return DYNAMIC, state
