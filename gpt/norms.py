"""The blocks' norms: LayerNorm or RMSNorm, and the query/key norms. Under sequence parallelism a gain's gradient is a
partial sum, all-reduced over TP in backward."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from base.errors import ConfigError
from base.options import option
from gpt.recomputed import plain_call, recomputed_in_backward
from gpt.rms_norm_backward import rms_norm_keeping_input
from parallel.init import InitMethod, set_init_method
from parallel.layers import meta_parameter
from parallel.mappings import copy_to_tensor_parallel_region, reduce_from_tensor_parallel_region
from parallel.sharding import record_whole
from parallel.state import ParallelState

NORMALIZATIONS = ("LayerNorm", "RMSNorm")  # Megatron-LM's --normalization choices we build
SUBLAYER_NORM_PLACES = ("input", "output", "input_and_output")


def _normalization_name(text: str) -> str:
    """Megatron-LM's RMSNorm and Megatron-DeepSpeed's rmsnorm are the same setting."""
    return {name.lower(): name for name in NORMALIZATIONS}.get(text.lower(), text)


@dataclass(frozen=True)
class NormSettings:
    SETTING_PREFIX: ClassVar[str] = ""

    layernorm_epsilon: float = option(1e-5, aliases={"--norm-epsilon": "Megatron-LM"})
    normalization: str = option("LayerNorm", type=_normalization_name,
                                help="LayerNorm (GPT-2) or RMSNorm (Llama); Megatron-DeepSpeed's layernorm/rmsnorm too")
    # Megatron-LM's --apply-layernorm-1p: each norm's gain is 1 + its weight, in fp32
    apply_layernorm_1p: bool = option(
        False, action="store_true",
        help="every norm's gain is 1 + its stored weight (Megatron's zero-centered gamma; Gemma's RMSNorm), computed "
             "in fp32; the weights start at 0")
    # "output": inside the residual branch (OLMo 2); both: Gemma 2/3
    sublayer_norms: str = option(
        "input", feature=True, choices=SUBLAYER_NORM_PLACES,
        help="where each block's norms act, inside the residual branches: on the attention's and the MLP's input "
             "(GPT-2, Llama), on their output (OLMo 2), or both (Gemma 2/3)")

    def validate(self) -> None:
        # refused with the launch's other problems, not by argparse
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(f"--normalization {self.normalization} is not implemented: the blocks here use "
                              f"{' or '.join(NORMALIZATIONS)}", flags=("--normalization",))
        if self.sublayer_norms not in SUBLAYER_NORM_PLACES:
            raise ConfigError(f"--sublayer-norms {self.sublayer_norms} is not one of {', '.join(SUBLAYER_NORM_PLACES)}",
                              flags=("--sublayer-norms",))
        if self.layernorm_epsilon <= 0:
            raise ConfigError(f"--layernorm-epsilon must be positive, got {self.layernorm_epsilon}",
                              flags=("--layernorm-epsilon",))

    def build(self, hidden_size: int, sequence_parallel_state=None, recompute: bool = False) -> nn.Module:
        return normalization(self.normalization, hidden_size, self.layernorm_epsilon, sequence_parallel_state,
                             self.apply_layernorm_1p, recompute)

    def build_sublayer(self, place: str, hidden_size: int, sequence_parallel_state=None, recompute: bool = False
                       ) -> Optional[nn.Module]:
        wanted = self.sublayer_norms in (place, "input_and_output")
        return self.build(hidden_size, sequence_parallel_state, recompute) if wanted else None


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False) -> torch.Tensor:
    """RMSNorm keeping only its input for backward (--recompute-modules layernorm), bit-identical to autograd."""
    if hidden.dtype == torch.float32:
        # the input goes in twice, so autograd sums its two gradients in the usual order
        return recomputed_in_backward(
            lambda scaled, squared, gain: rms_norm_math(scaled, gain, eps, zero_centered, squared=squared),
            hidden, hidden, weight)
    return recomputed_in_backward(functools.partial(rms_norm_math, eps=eps, zero_centered=zero_centered),
                                  hidden, weight)


def rms_norm_math(hidden: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
                  squared: Optional[torch.Tensor] = None) -> torch.Tensor:
    as_float = hidden.float()
    of_squares = as_float if squared is None else squared.float()
    normed = as_float * torch.rsqrt(of_squares.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        return (normed * (1.0 + weight.float())).to(hidden.dtype)
    return weight * normed.to(hidden.dtype)


def _gain_init(zero_centered: bool) -> InitMethod:
    return InitMethod.zeros() if zero_centered else InitMethod.ones()


class RMSNorm(nn.Module):
    """RMSNorm in fp32, cast back before the gain, as transformers' LlamaRMSNorm, so 16-bit runs round where theirs
    do."""

    def __init__(self, hidden_size: int, eps: float, sequence_parallel_state: Optional[ParallelState] = None,
                 zero_centered: bool = False, recompute: bool = False):
        super().__init__()
        self.eps, self.sequence_parallel_state, self.zero_centered = eps, sequence_parallel_state, zero_centered
        self.recompute = recompute
        self.weight = meta_parameter((hidden_size,), _gain_init(zero_centered))
        self.weight.sequence_parallel = sequence_parallel_state is not None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        norm = rms_norm if self.recompute else rms_norm_math if plain_call(hidden, self.weight) else \
            rms_norm_keeping_input
        return norm(hidden, _summed_over_sequence_slices(self.weight, self.sequence_parallel_state), self.eps,
                    self.zero_centered)


def zero_centered_layer_norm(hidden: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor,
                             bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """LayerNorm with gain 1 + weight (Megatron's zero-centered gamma), in fp32 and cast back."""
    return F.layer_norm(hidden.float(), shape, 1.0 + weight.float(), None if bias is None else bias.float(),
                        eps).to(hidden.dtype)


class SequenceParallelLayerNorm(nn.LayerNorm):
    def __init__(self, hidden_size: int, eps: float, sequence_parallel_state: Optional[ParallelState],
                 zero_centered: bool = False):
        super().__init__(hidden_size, eps=eps, device="meta")
        self.sequence_parallel_state, self.zero_centered = sequence_parallel_state, zero_centered

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        state = self.sequence_parallel_state
        weight = _summed_over_sequence_slices(self.weight, state)
        bias = _summed_over_sequence_slices(self.bias, state)
        if self.zero_centered:
            return zero_centered_layer_norm(hidden, self.normalized_shape, weight, bias, self.eps)
        return F.layer_norm(hidden, self.normalized_shape, weight, bias, self.eps)


def _summed_over_sequence_slices(parameter: torch.Tensor, state: Optional[ParallelState]) -> torch.Tensor:
    return parameter if state is None else copy_to_tensor_parallel_region(parameter, state)


def layer_norm(hidden_size: int, eps: float, sequence_parallel_state: Optional[ParallelState] = None,
               zero_centered: bool = False) -> nn.LayerNorm:
    if sequence_parallel_state is None and not zero_centered:
        norm = nn.LayerNorm(hidden_size, eps=eps, device="meta")
    else:
        norm = SequenceParallelLayerNorm(hidden_size, eps, sequence_parallel_state, zero_centered)
    set_init_method(record_whole(norm.weight), _gain_init(zero_centered))
    set_init_method(record_whole(norm.bias), InitMethod.zeros())
    norm.weight.sequence_parallel = norm.bias.sequence_parallel = sequence_parallel_state is not None
    return norm


def normalization(kind: str, hidden_size: int, eps: float,
                  sequence_parallel_state: Optional[ParallelState] = None, zero_centered: bool = False,
                  recompute: bool = False) -> nn.Module:
    if kind == "RMSNorm":
        return RMSNorm(hidden_size, eps, sequence_parallel_state, zero_centered, recompute)
    return layer_norm(hidden_size, eps, sequence_parallel_state, zero_centered)


class HeadNorm(nn.Module):
    """--qk-layernorm's norm over each head's dims; its shared gain's gradient is all-reduced over TP in backward."""

    def __init__(self, kind: str, head_dim: int, eps: float, state: ParallelState, zero_centered: bool = False):
        super().__init__()
        self.kind, self.head_dim, self.eps, self.state, self.zero_centered = kind, head_dim, eps, state, zero_centered
        self.weight = meta_parameter((head_dim,), _gain_init(zero_centered))
        if kind == "RMSNorm":
            self.register_parameter("bias", None)
        else:
            self.bias = meta_parameter((head_dim,), InitMethod.zeros())

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        weight = copy_to_tensor_parallel_region(self.weight, self.state)
        if self.bias is None:  # Megatron-Core's selective recompute never takes these norms
            return rms_norm_math(heads, weight, self.eps, self.zero_centered)
        bias = copy_to_tensor_parallel_region(self.bias, self.state)
        if self.zero_centered:
            return zero_centered_layer_norm(heads, (self.head_dim,), weight, bias, self.eps)
        return F.layer_norm(heads, (self.head_dim,), weight, bias, self.eps)


class L2HeadNorm(nn.Module):
    """--qk-l2-norm: Megatron-Core's L2Norm over each head, RMSNorm without a gain."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        as_float = heads.float()
        return (as_float * torch.rsqrt(as_float.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(heads)


class ProjectionNorm(nn.Module):
    """--qk-layernorm-over-projection (OLMo 2): statistics over the whole projection, all-reduced over TP, so it equals
    transformers' at any TP size."""

    def __init__(self, kind: str, width: int, eps: float, state: ParallelState, zero_centered: bool = False):
        super().__init__()
        tp = state.tensor_parallel_size
        if width % tp:
            raise ValueError(f"a projection of {width} features does not split over {tp} tensor-parallel ranks")
        self.kind, self.width, self.eps, self.state, self.zero_centered = kind, width, eps, state, zero_centered
        self.weight = meta_parameter((width // tp,), _gain_init(zero_centered), state, split_dim=0)
        if kind == "RMSNorm":
            self.register_parameter("bias", None)
        else:
            self.bias = meta_parameter((width // tp,), InitMethod.zeros(), state, split_dim=0)

    def _mean(self, values: torch.Tensor) -> torch.Tensor:
        if self.state.tensor_parallel_size == 1:
            return values.mean(-1, keepdim=True)
        total = copy_to_tensor_parallel_region(values.sum(-1, keepdim=True), self.state)
        return reduce_from_tensor_parallel_region(total, self.state) / self.width

    def forward(self, projected: torch.Tensor) -> torch.Tensor:
        as_float = projected.float()
        gain = 1.0 + self.weight.float() if self.zero_centered else self.weight
        if self.bias is None:
            normed = as_float * torch.rsqrt(self._mean(as_float.pow(2)) + self.eps)
            return (gain * normed).to(projected.dtype)
        centered = as_float - self._mean(as_float)
        normed = centered * torch.rsqrt(self._mean(centered.pow(2)) + self.eps)
        return (gain * normed + self.bias).to(projected.dtype)
