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
from typing import Optional

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


def quantize_delayed(tensor: torch.Tensor, scale: torch.Tensor, history: torch.Tensor, column: int,
                     dtype: torch.dtype, counts=None, iteration: Optional[tuple] = None):
    """One delayed-scaling role's cast: `tensor` cast with scale[column], and its amax recorded (a max) in
    history[0, column], in place. Returns the FP8 data, the dequantizing scale and the amax. `iteration` (a compiled
    block's weight, parallel/fp8/weight_cache.py): (first, the iteration's scale) tensors; in the iteration's first
    micro-batch (first 1.0) as above, the scale kept; in the others the kept scale and no amax recorded, as
    TransformerEngine's cached weight is."""
    used = scale[column]
    if iteration is not None:
        first, kept = iteration
        used = torch.where(first > 0, used, kept)
        kept.copy_(used)
    data, scale_inv = quantize_tensorwise(tensor, used, dtype, counts)
    amax = amax_of(tensor)
    recorded = torch.maximum(history[0, column], amax)
    if iteration is not None:
        recorded = torch.where(first > 0, recorded, history[0, column])
    history[0, column] = recorded
    return data, scale_inv, amax


def amax_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().abs().amax().float()


def input_type_max(tensor: torch.Tensor) -> float:
    """TE's value_for_inf: the largest finite value of the tensor's own (high-precision) type."""
    return torch.finfo(tensor.dtype).max


class DelayedScaling:
    """TE's DelayedScaling state for one linear: an amax history (history_len rows) and a scale per role,
    fp32, starting at 1 (TE's initial scale). A role's tensor is cast with the scale its history gave and its
    amax is recorded (a max) in the history's row 0; once per pass (parallel/fp8/delayed_updates.py) every
    linear's recorded amaxes are reduced over the run's amax group and the scales updated, as TE does when its
    autocast region ends (quantization.py, reduce_and_update_fp8_tensors: _default_get_amax_and_update_history,
    _update_amax_history, _default_sf_compute):
      amax = max over the history ('max') or row 0 ('most_recent');
      the history rolls by -1 and row 0 is zeroed (the oldest entry leaves);
      scale = (fp8_max / amax) / 2^margin.
    Each role is cast once in a region (parallel/fp8/delayed_updates.py says why), so these are the scales an
    update right after each cast would give. Under torch.compile (docs/fp8.md) the forward roles (input, weight) and the backward's (the output gradient)
    live in tensors of their own, each written where its role needs:
    - `forward_scale` is replaced, never written in place: a compiled block's backward may compute a dequantizing
      scale again from the scale tensor its forward read (AOTAutograd's partitioner recomputes cheap operations
      from the graph's inputs), so that tensor must keep its value until then, however many passes run between
      (pipeline schedules); a version check stops the backward if it was written;
    - `backward_scale` is written in place: the backward reads it when it runs, as TE's does;
    - the histories are written in place (row 0 by the casts, in the compiled graphs), and no backward reads the
      forward's."""

    def __init__(self, recipe: Fp8Recipe, device: torch.device | str = "cpu"):
        self.recipe = recipe
        rows = recipe.amax_history_len
        self.forward_history = torch.zeros(rows, 2, dtype=torch.float32, device=device)  # INPUT, WEIGHT
        self.forward_scale = torch.ones(2, dtype=torch.float32, device=device)
        self.backward_history = torch.zeros(rows, 1, dtype=torch.float32, device=device)  # GRAD_OUTPUT
        self.backward_scale = torch.ones(1, dtype=torch.float32, device=device)
        # Activation recomputation (parallel/fp8/recompute.py): the forward roles' history and scales each
        # checkpointed forward cast with, oldest first.
        self._recompute_stash: deque = deque()

    def role_tensors(self, role: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The history and scale tensors holding `role`, and its column in them."""
        if role == GRAD_OUTPUT:
            return self.backward_history, self.backward_scale, 0
        return self.forward_history, self.forward_scale, role

    def quantize(self, tensor: torch.Tensor, role: int, dtype: torch.dtype, counts=None):
        """Cast with this role's current scale and record the tensor's amax; returns (fp8 data, dequantizing
        scale). The scale changes only at the pass's update (delayed_updates.py)."""
        history, scale, column = self.role_tensors(role)
        data, scale_inv, _ = quantize_delayed(tensor, scale, history, column, dtype, counts)
        return data, scale_inv

    def record_amax(self, role: int, amax: torch.Tensor) -> None:
        """Row 0 of the role's history takes the max with `amax`: a cast here, or a weight cast elsewhere
        (--fp8-param-gather, parallel/fp8/param_gather.py), updated at the end of the forward that uses it."""
        history, _, column = self.role_tensors(role)
        history[0, column] = torch.maximum(history[0, column], amax)

    def scale_of(self, role: int) -> torch.Tensor:
        history, scale, column = self.role_tensors(role)
        return scale[column].clone()

    @property
    def amax_history(self) -> torch.Tensor:
        """[history_len, 3], TE's fp8 meta order (input, weight, grad output): a copy, for reading."""
        return torch.cat([self.forward_history, self.backward_history], dim=1)

    @property
    def scale(self) -> torch.Tensor:
        """[3] in the same order: a copy, for reading."""
        return torch.cat([self.forward_scale, self.backward_scale])

    def stash_for_recompute(self) -> None:
        """Before a forward that will be recomputed: keep the forward roles' history and scales, as TE's
        copy_forward_fp8_meta_tensors_for_recompute keeps its scaling_fwd meta (amax_history, scale clones) in a
        FIFO per module (transformer_engine/pytorch/quantization.py, FP8GlobalStateManager)."""
        self._recompute_stash.append((self.forward_history.clone(), self.forward_scale.clone()))

    def begin_recompute(self) -> tuple:
        """Switch the forward roles to the oldest stash for a recomputed forward (TE's
        get_old_fp8_meta_tensors_for_recompute: the updated values kept aside, the stashed ones in); returns
        the updated values for end_recompute, which puts them back over whatever the recompute recorded: TE's
        recompute-phase modules join no amax reduction, and what their casts record is discarded."""
        updated = (self.forward_history, self.forward_scale)
        history, scale = self._recompute_stash.popleft()
        self.forward_history, self.forward_scale = history.clone(), scale  # the recompute writes its own rows
        return updated

    def end_recompute(self, updated: tuple) -> None:
        """TE's restore_fp8_meta_tensors: the values the original forward left, back in place."""
        self.forward_history, self.forward_scale = updated

    def snapshot(self) -> tuple:
        """Everything a pass changes (histories, scales, the recompute stash), to run an iteration again from
        where it started (--fp8-guard's replay, training/fp8_guard_replay.py)."""
        return (self.forward_history.clone(), self.forward_scale.clone(), self.backward_history.clone(),
                self.backward_scale.clone(), [tuple(entry) for entry in self._recompute_stash])

    def restore(self, snapshot: tuple) -> None:
        forward_history, forward_scale, backward_history, backward_scale, stash = snapshot
        self.forward_history.copy_(forward_history)
        self.forward_scale = forward_scale.clone()
        self.backward_history.copy_(backward_history)
        self.backward_scale.copy_(backward_scale)
        self._recompute_stash = deque(stash)

    def state_dict(self) -> dict:
        return {"amax_history": self.amax_history, "scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        self.forward_history.copy_(state["amax_history"][:, :2])
        self.backward_history.copy_(state["amax_history"][:, 2:])
        self.forward_scale = state["scale"][:2].to(self.forward_scale).clone()
        self.backward_scale.copy_(state["scale"][2:])
