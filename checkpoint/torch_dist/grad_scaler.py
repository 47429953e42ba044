"""fp16's loss scaler in Megatron-LM's torch_dist checkpoints, both ways.

A 16-bit Megatron-LM run's optimizer (optimizer.py Float16OptimizerWithFloat16Params.state_dict, and the
distributed optimizer's) saves its grad scaler beside Adam's state in common.pt: `optimizer.grad_scaler`, the
DynamicGradScaler's {'scale': a 1-element fp32 tensor, 'growth_tracker', 'hysteresis_tracker'} under --fp16, the
ConstantGradScaler's {} under --fp16 --loss-scale, nothing under bf16 and fp32 (no scaler). The rule is the one
zero/loss_scaler.py's DynamicLossScaler follows (halve after `hysteresis` overflows, double after `growth_interval`
clean steps), so its state maps field for field: good_steps is growth_tracker, hysteresis_left hysteresis_tracker.
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
    """(our scaler's class name, its state) from a Megatron-LM grad scaler's state; None for the constant scaler's
    (the scale is the run's --loss-scale)."""
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
