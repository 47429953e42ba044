"""Gradient accumulation fusion on a ZeRO model (--gradient-accumulation-fusion): which tensor-parallel linears add
their weight gradient into the fp32 main gradient inside the GEMM, and the start-up line naming the path. Only an fp32
main gradient (a stage 0-1 buffer or a stage 2-3 bucket slot) fuses; 16-bit gradients never do."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from parallel.grad_accumulation_fusion import LinearIntoMainGrad, accumulation_path
from parallel.layers import ColumnParallelLinear, RowParallelLinear
from zero.grad_reducer import PartitionedGradients

FLAG = "--gradient-accumulation-fusion"


def apply_gradient_accumulation_fusion(model: nn.Module, reducer, enabled: bool, device: torch.device, *,
                                       left_out: Sequence[tuple[nn.Module, str]] = ()) -> str:
    """Make each fusing linear add its weight gradient into the main gradient; returns the start-up line."""
    if not enabled:
        return ("> gradient accumulation fusion off (--no-gradient-accumulation-fusion): each weight gradient is "
                "autograd's, in the parameters' dtype, then added into the main gradient")
    kept: dict[str, int] = {}
    skipped = {id(inner): why for module, why in left_out for inner in module.modules()}
    fused: list[nn.Module] = []
    fused_fp8: list[nn.Module] = []
    for layer in model.modules():
        if not isinstance(layer, (ColumnParallelLinear, RowParallelLinear)) or not layer.weight.requires_grad:
            continue
        holder = next((part for part in reducer.gradient_reducers() if part.holds(layer.weight)), None)
        if holder is None:  # a pipeline stage's other chunk holds its own reducer
            continue
        why = skipped.get(id(layer))
        fp8_state = getattr(layer, "fp8_state", None)
        if why is None and fp8_state is None and layer.linear is not F.linear:
            why = "their own GEMM"
        if why is None and holder.grad_dtype != torch.float32:
            why = "autograd's gradient: their main gradient is 16-bit"
        if why is not None:
            kept[why] = kept.get(why, 0) + 1
            continue
        if fp8_state is not None:
            fp8_state.main_grads = holder
            fused_fp8.append(layer)
        else:
            layer.linear = LinearIntoMainGrad(holder)
            fused.append(layer)
    others = "".join(f"; {count} keep {why}" for why, count in kept.items())
    if not fused and not fused_fp8:
        return f"> gradient accumulation fusion ({FLAG}): no linear fuses{others or ': the model has none'}"
    partitioned = all(isinstance(part, PartitionedGradients) for part in reducer.gradient_reducers())
    into = "their slot of the fp32 reduce bucket (ZeRO 2-3)" if partitioned else "the fp32 main gradient"
    paths = []
    if fused:
        path = accumulation_path(fused[0].weight.dtype, device)
        paths.append(f"{len(fused)} by {path}" if fused_fp8 else path)
    if fused_fp8:
        paths.append(f"{len(fused_fp8)} FP8: their GEMM FP8, the weight gradient's written in fp32 and added in the "
                     f"backward's epilogue region, where the guard checks it (TransformerEngine's "
                     f"fuse_wgrad_accumulation)")
    return (f"> gradient accumulation fusion ({FLAG}, Megatron-LM's default): {len(fused) + len(fused_fp8)} "
            f"tensor-parallel linears add their weight gradient into {into} inside the GEMM, {'; '.join(paths)}"
            f"{others}")


def fused_weights(model: nn.Module) -> set[int]:
    """Ids of the weights whose gradient autograd never materialises."""
    return {id(layer.weight) for layer in model.modules()
            if isinstance(layer, (ColumnParallelLinear, RowParallelLinear))
            and (isinstance(layer.linear, LinearIntoMainGrad)
                 or getattr(getattr(layer, "fp8_state", None), "main_grads", None) is not None)}
