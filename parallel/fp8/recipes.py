"""Megatron-Core's FP8 settings with TransformerEngine's semantics: --fp8-format and --fp8-recipe mapped as
fp8_utils.get_fp8_recipe maps them, and the per-tensor scale formulas of TE's code (delayed and current scaling)."""

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
INPUT, WEIGHT, GRAD_OUTPUT = 0, 1, 2


@dataclass(frozen=True)
class Fp8Recipe:
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
        return E5M2 if self.fp8_format == "hybrid" else E4M3

    @property
    def wgrad_in_fp8(self) -> bool:
        """Megatron passes --no-fp8-wgrad to TE only for delayed scaling."""
        return self.wgrad or self.recipe != "delayed"


def power_of_two_floor(scale: torch.Tensor) -> torch.Tensor:
    """Keep sign and exponent, drop the mantissa: TE's `scale_bits &= 0xFF800000`."""
    bits = scale.contiguous().view(torch.int32) & -0x800000
    return bits.view(torch.float32)


def current_scale(amax: torch.Tensor, fp8_max: float, power_of_two: bool, value_for_inf: float) -> torch.Tensor:
    """TE's compute_scale_from_amax in fp32: 1 where amax is 0, inf or nan; fp8_max / amax, value_for_inf where that
    overflows; the mantissa dropped for power-of-two scales."""
    amax = amax.float()
    scale = torch.full_like(amax, fp8_max) / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, value_for_inf), scale)
    scale = torch.where((amax == 0) | torch.isinf(amax) | torch.isnan(amax), torch.ones_like(scale), scale)
    return power_of_two_floor(scale) if power_of_two else scale


def delayed_scale(amax: torch.Tensor, previous_scale: torch.Tensor, fp8_max: float, margin: int) -> torch.Tensor:
    """TE's _default_sf_compute: (fp8_max / amax) / 2^margin; the previous scale where amax is 0 or not finite."""
    scale = (fp8_max / amax) / (2 ** margin)  # torch's reciprocal-then-multiply, as in TE
    scale = torch.where(amax > 0.0, scale, previous_scale)
    scale = torch.where(torch.isfinite(amax), scale, previous_scale)
    return torch.where(torch.isinf(scale), torch.full_like(scale, FP32_MAX), scale)


def saturating_cast(scaled: torch.Tensor, dtype: torch.dtype, counts=None) -> torch.Tensor:
    """Cast to FP8 clamping to the largest finite value, as TE does (torch turns an e5m2 overflow into inf). `counts`:
    the guard's CastCounts."""
    limit = FP8_MAX[dtype]
    clamped = scaled.clamp(-limit, limit)
    data = clamped.to(dtype)
    if counts is not None:
        counts.add(scaled, clamped, data)
    return data


def quantize_tensorwise(tensor: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, counts=None):
    data = saturating_cast(tensor.float() * scale, dtype, counts)
    return data, torch.reciprocal(scale).reshape(())


def quantize_delayed(tensor: torch.Tensor, scale: torch.Tensor, history: torch.Tensor, column: int,
                     dtype: torch.dtype, counts=None, iteration: Optional[tuple] = None):
    """One delayed-scaling role's cast with scale[column], its amax recorded in history[0, column]. Returns data,
    scale_inv, amax. `iteration`: a compiled block's weight, whose later micro-batches reuse the first's scale."""
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
    """TE's value_for_inf: the largest finite value of the tensor's own type."""
    return torch.finfo(tensor.dtype).max


class DelayedScaling:
    """TE's DelayedScaling state for one linear: an amax history and a scale per role, fp32, starting at 1. The forward
    roles' scale is replaced, never written in place, since a compiled backward may recompute from the tensor its
    forward read."""

    def __init__(self, recipe: Fp8Recipe, device: torch.device | str = "cpu"):
        self.recipe = recipe
        rows = recipe.amax_history_len
        self.forward_history = torch.zeros(rows, 2, dtype=torch.float32, device=device)
        self.forward_scale = torch.ones(2, dtype=torch.float32, device=device)
        self.backward_history = torch.zeros(rows, 1, dtype=torch.float32, device=device)
        self.backward_scale = torch.ones(1, dtype=torch.float32, device=device)
        # the forward roles' history and scales each checkpointed forward cast with, oldest first
        self._recompute_stash: deque = deque()

    def role_tensors(self, role: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        if role == GRAD_OUTPUT:
            return self.backward_history, self.backward_scale, 0
        return self.forward_history, self.forward_scale, role

    def quantize(self, tensor: torch.Tensor, role: int, dtype: torch.dtype, counts=None):
        """Cast with this role's current scale and record the amax; returns (fp8 data, dequantizing scale)."""
        history, scale, column = self.role_tensors(role)
        data, scale_inv, _ = quantize_delayed(tensor, scale, history, column, dtype, counts)
        return data, scale_inv

    def record_amax(self, role: int, amax: torch.Tensor) -> None:
        """Row 0 of the role's history takes the max with `amax`."""
        history, _, column = self.role_tensors(role)
        history[0, column] = torch.maximum(history[0, column], amax)

    def scale_of(self, role: int) -> torch.Tensor:
        history, scale, column = self.role_tensors(role)
        return scale[column].clone()

    @property
    def amax_history(self) -> torch.Tensor:
        """[history_len, 3] in TE's fp8 meta order: a copy."""
        return torch.cat([self.forward_history, self.backward_history], dim=1)

    @property
    def scale(self) -> torch.Tensor:
        return torch.cat([self.forward_scale, self.backward_scale])

    def stash_for_recompute(self) -> None:
        """Keep the forward roles' history and scales before a forward that will be recomputed (TE's recompute FIFO)."""
        self._recompute_stash.append((self.forward_history.clone(), self.forward_scale.clone()))

    def begin_recompute(self) -> tuple:
        """Switch the forward roles to the oldest stash for a recompute; returns the updated values for
        end_recompute."""
        updated = (self.forward_history, self.forward_scale)
        history, scale = self._recompute_stash.popleft()
        self.forward_history, self.forward_scale = history.clone(), scale
        return updated

    def end_recompute(self, updated: tuple) -> None:
        self.forward_history, self.forward_scale = updated

    def snapshot(self) -> tuple:
        """Everything a pass changes, to run an iteration again (--fp8-guard's replay)."""
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
