"""Megatron-Core's FP8 settings with TransformerEngine's semantics: the formats, the recipes, and the
per-tensor scales (delayed and current scaling).

Megatron (megatron/core/fp8_utils.py, get_fp8_recipe) maps --fp8-format e4m3|hybrid to TE's Format and
--fp8-recipe to TE's recipes: delayed -> DelayedScaling(margin, amax_history_len, amax_compute_algo,
override_linear_precision=(False, False, not fp8_wgrad)), tensorwise -> Float8CurrentScaling,
blockwise -> Float8BlockScaling, mxfp8 -> MXFP8BlockScaling. TE (transformer_engine/common/recipe):
E4M3's largest finite value is 448, E5M2's 57344; hybrid is e4m3 forward, e5m2 for gradients. The formulas
below follow TE's code line by line (cited at each function).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from parallel.fp8.kernel import E4M3, E5M2

FORMATS = ("e4m3", "hybrid")
RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
AMAX_COMPUTE_ALGOS = ("most_recent", "max")
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
FP32_MAX = torch.finfo(torch.float32).max
# The delayed-scaling roles of one linear, TE's fp8 meta order (forward: input, weight; backward: grad output).
INPUT, WEIGHT, GRAD_OUTPUT = 0, 1, 2


@dataclass(frozen=True)
class Fp8Recipe:
    """One run's FP8 settings (Megatron-Core's TransformerConfig fields; defaults as Megatron's)."""
    fp8_format: str = "hybrid"
    recipe: str = "delayed"
    margin: int = 0
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"
    wgrad: bool = True

    @property
    def forward_dtype(self) -> torch.dtype:
        return E4M3

    @property
    def backward_dtype(self) -> torch.dtype:
        """Gradients' format: e5m2 under hybrid, e4m3 under e4m3 (TE's Format.HYBRID / Format.E4M3)."""
        return E5M2 if self.fp8_format == "hybrid" else E4M3

    @property
    def wgrad_in_fp8(self) -> bool:
        """Megatron passes --no-fp8-wgrad to TE only for delayed scaling (override_linear_precision);
        the other recipes are built without it, so their weight gradient stays in FP8."""
        return self.wgrad or self.recipe != "delayed"


def power_of_two_floor(scale: torch.Tensor) -> torch.Tensor:
    """Keep sign and exponent, drop the mantissa: TE's `scale_bits &= 0xFF800000` (compute_scale_from_amax)."""
    bits = scale.contiguous().view(torch.int32) & -0x800000  # 0xFF800000 as a signed int32
    return bits.view(torch.float32)


def current_scale(amax: torch.Tensor, fp8_max: float, power_of_two: bool, value_for_inf: float) -> torch.Tensor:
    """TE's compute_scale_from_amax (transformer_engine/common/recipe/recipe_common.cuh), elementwise, fp32,
    amax_epsilon 0: 1 where amax is 0, inf or nan; fp8_max / amax (correctly rounded); value_for_inf (the
    input type's largest value) where that overflows; then the mantissa dropped for power-of-two scales."""
    amax = amax.float()
    scale = torch.full_like(amax, fp8_max) / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, value_for_inf), scale)
    scale = torch.where((amax == 0) | torch.isinf(amax) | torch.isnan(amax), torch.ones_like(scale), scale)
    return power_of_two_floor(scale) if power_of_two else scale


def delayed_scale(amax: torch.Tensor, previous_scale: torch.Tensor, fp8_max: float, margin: int) -> torch.Tensor:
    """TE's _default_sf_compute (transformer_engine/pytorch/quantization.py):
    scale = (fp8_max / amax) / 2^margin; the previous scale where amax is 0 or not finite; fp32 max where
    the scale overflows."""
    scale = (fp8_max / amax) / (2 ** margin)  # a float over a tensor: torch's reciprocal-then-multiply, as in TE
    scale = torch.where(amax > 0.0, scale, previous_scale)
    scale = torch.where(torch.isfinite(amax), scale, previous_scale)
    return torch.where(torch.isinf(scale), torch.full_like(scale, FP32_MAX), scale)


def saturating_cast(scaled: torch.Tensor, dtype: torch.dtype, counts=None) -> torch.Tensor:
    """Cast to FP8 clamping to the largest finite value, as TE's casts do (CUDA's __NV_SATFINITE); torch's
    plain cast saturates e4m3 but turns an e5m2 overflow into inf. NaN stays NaN. `counts` (the guard's
    CastCounts, parallel/fp8/guard.py; None: nothing counted) gets the saturated and flushed values."""
    limit = FP8_MAX[dtype]
    clamped = scaled.clamp(-limit, limit)
    data = clamped.to(dtype)
    if counts is not None:
        counts.add(scaled, clamped, data)
    return data


def quantize_tensorwise(tensor: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, counts=None):
    """(tensor * scale) cast to dtype, and the dequantizing scale 1 / scale (TE's scale_inv), both fp32."""
    data = saturating_cast(tensor.float() * scale, dtype, counts)
    return data, torch.reciprocal(scale).reshape(())


def amax_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().abs().amax().float()


def input_type_max(tensor: torch.Tensor) -> float:
    """TE's value_for_inf: the largest finite value of the tensor's own (high-precision) type."""
    return torch.finfo(tensor.dtype).max


class DelayedScaling:
    """TE's DelayedScaling state for one linear: an amax history (history_len x 3 roles) and a scale per
    role, fp32, starting at 1 (TE's initial scale). A role's tensor is cast with the scale its history gave
    (computed after the previous use), its amax is written to the history's row 0, and then
    (TE's _default_get_amax_and_update_history, _update_amax_history, _default_sf_compute):
      amax = max over the history ('max') or row 0 ('most_recent');
      the history rolls by -1 and row 0 is zeroed (the oldest entry leaves);
      scale = (fp8_max / amax) / 2^margin.
    TE runs the update when the autocast region ends; Megatron opens one region per micro-batch forward,
    and each role is cast once in it, so updating right after the cast is the same sequence of scales.

    Over several ranks, TE all-reduces (max) the new amax (history row 0) over the autocast's fp8_group
    before the update (quantization.py, reduce_and_update_fp8_tensors); Megatron-Core passes
    parallel_state.get_amax_reduction_group(with_context_parallel=True), the tensor x data (x context)
    parallel ranks (megatron/core/fp8_utils.py, get_fp8_context). That is `reduce_amax` here (an in-place
    max all-reduce over that group, through the run's communicator; None in one process): after it a
    weight shard's amax is the whole weight's, a row-parallel input's the whole input's, and every rank of
    the group holds the same history and scales. A max is exact in any order, so the reduction is bitwise
    the one process's amax of the same tensors."""

    def __init__(self, recipe: Fp8Recipe, device: torch.device | str = "cpu",
                 reduce_amax: Optional[Callable[[torch.Tensor], None]] = None):
        self.recipe = recipe
        self.reduce_amax = reduce_amax
        self.amax_history = torch.zeros(recipe.amax_history_len, 3, dtype=torch.float32, device=device)
        self.scale = torch.ones(3, dtype=torch.float32, device=device)
        # Activation recomputation (parallel/fp8/recompute.py): the forward roles' scales each checkpointed forward
        # cast with, oldest first, and whether a recomputed forward is running now.
        self._recompute_stash: deque = deque()
        self.recomputing = False

    def quantize(self, tensor: torch.Tensor, role: int, dtype: torch.dtype, counts=None):
        """Cast with this role's current scale, record the amax, update the role's scale; returns
        (fp8 data, dequantizing scale)."""
        scale = self.scale[role].clone()
        data, scale_inv = quantize_tensorwise(tensor, scale, dtype, counts)
        if self.recomputing:  # the original forward's scale, nothing recorded (TE: restored after the recompute)
            return data, scale_inv
        self.amax_history[0, role] = torch.maximum(self.amax_history[0, role], amax_of(tensor))
        self.update_recorded(role, dtype)
        return data, scale_inv

    def update_recorded(self, role: int, dtype: torch.dtype) -> None:
        """Reduce the amax the history's newest row holds for this role and update its scale: after this
        forward's cast, or, for a weight cast elsewhere (--fp8-param-gather, parallel/fp8/param_gather.py), at the
        forward that uses it, as TE's autocast exit does with FP8 parameters (0 when nothing was cast since the
        last update: the scale then stays, _default_sf_compute)."""
        if self.recomputing:
            return
        amax = self.amax_history[0, role].reshape(1).clone()
        if self.reduce_amax is not None:
            self.reduce_amax(amax)
        self.amax_history[0, role] = amax[0]
        self._update(role, FP8_MAX[dtype])

    def _update(self, role: int, fp8_max: float) -> None:
        history = self.amax_history[:, role]
        amax = history.amax() if self.recipe.amax_compute_algo == "max" else history[0].clone()
        if history.numel() > 1:
            history.copy_(torch.roll(history, -1, 0))
        history[0] = 0.0
        self.scale[role] = delayed_scale(amax, self.scale[role], fp8_max, self.recipe.margin)

    def stash_for_recompute(self) -> None:
        """Before a forward that will be recomputed: keep the forward roles' history and scales, as TE's
        copy_forward_fp8_meta_tensors_for_recompute keeps its scaling_fwd meta (amax_history, scale clones) in a
        FIFO per module (transformer_engine/pytorch/quantization.py, FP8GlobalStateManager)."""
        forward = [INPUT, WEIGHT]
        self._recompute_stash.append((self.amax_history[:, forward].clone(), self.scale[forward].clone()))

    def begin_recompute(self) -> tuple:
        """Switch the forward roles to the oldest stash for a recomputed forward (TE's
        get_old_fp8_meta_tensors_for_recompute: the updated values kept aside, the stashed ones in); returns
        the updated values for end_recompute. While recomputing nothing is recorded, reduced or updated: TE's
        recompute-phase modules join no amax reduction, and what their casts record is discarded."""
        forward = [INPUT, WEIGHT]
        updated = (self.amax_history[:, forward].clone(), self.scale[forward].clone())
        history, scale = self._recompute_stash.popleft()
        self.amax_history[:, forward] = history
        self.scale[forward] = scale
        self.recomputing = True
        return updated

    def end_recompute(self, updated: tuple) -> None:
        """TE's restore_fp8_meta_tensors: the values the original forward left, back in place."""
        forward = [INPUT, WEIGHT]
        self.amax_history[:, forward] = updated[0]
        self.scale[forward] = updated[1]
        self.recomputing = False

    def state_dict(self) -> dict:
        return {"amax_history": self.amax_history.clone(), "scale": self.scale.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.amax_history.copy_(state["amax_history"])
        self.scale.copy_(state["scale"])
