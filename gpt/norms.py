"""The blocks' normalization: LayerNorm (GPT-2, with bias) or RMSNorm (Llama, gain only); and the
per-head norms of --qk-layernorm (or --qk-l2-norm's, without a gain), or with --qk-layernorm-over-projection its
norms over the whole query and key projections (OLMo 2).

Under sequence parallelism a block's norms see only this rank's slice of the sequence, so the gradient
of their (replicated) gain and bias is a partial sum: they enter through `copy`, whose backward
all-reduces it over the TP group. They carry `sequence_parallel = True`, as Megatron marks them; Megatron
all-reduces
their gradients over TP once per step (megatron/core/distributed/finalize_model_grads.py,
_allreduce_layernorm_grads); here it happens in backward, before ZeRO's hooks see the gradient.
"""

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
SUBLAYER_NORM_PLACES = ("input", "output", "input_and_output")  # --sublayer-norms


def _normalization_name(text: str) -> str:
    """Megatron-LM spells it RMSNorm, Megatron-DeepSpeed rmsnorm (its --normalization choices are
    layernorm and rmsnorm): either is the same setting."""
    return {name.lower(): name for name in NORMALIZATIONS}.get(text.lower(), text)


@dataclass(frozen=True)
class NormSettings:
    """The norms' section of the model's settings (base/options.py section()): which normalization, its epsilon and
    gain, and where a block's norms act; Megatron-LM's flags named as their dests. The query/key norms' choice is the
    attention's (gpt/attention_settings.py); their kind and epsilon are these."""
    SETTING_PREFIX: ClassVar[str] = ""

    layernorm_epsilon: float = option(1e-5, aliases={"--norm-epsilon": "Megatron-LM"})
    normalization: str = option("LayerNorm", type=_normalization_name,
                                help="LayerNorm (GPT-2) or RMSNorm (Llama); Megatron-DeepSpeed's layernorm/rmsnorm too")
    # Megatron-LM's --apply-layernorm-1p: each norm's gain is 1 + its weight, in fp32
    apply_layernorm_1p: bool = option(
        False, action="store_true",
        help="every norm's gain is 1 + its stored weight (Megatron's zero-centered gamma; Gemma's RMSNorm), computed "
             "in fp32; the weights start at 0")
    # where each block's norms act: "input" (before attention and MLP), "output" (on their outputs, inside the
    # residual branch: OLMo 2), "input_and_output" (Gemma 2/3)
    sublayer_norms: str = option(
        "input", feature=True, choices=SUBLAYER_NORM_PLACES,
        help="where each block's norms act, inside the residual branches: on the attention's and the MLP's input "
             "(GPT-2, Llama), on their output (OLMo 2), or both (Gemma 2/3)")

    def validate(self) -> None:
        # A value Megatron accepts but this model lacks is refused here, with the launch's other problems, rather
        # than by argparse's choices, whose error would end the one round of checks (arguments/parser.py).
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
        """A norm of this kind, epsilon and gain over `hidden_size` features (normalization's arguments)."""
        return normalization(self.normalization, hidden_size, self.layernorm_epsilon, sequence_parallel_state,
                             self.apply_layernorm_1p, recompute)

    def build_sublayer(self, place: str, hidden_size: int, sequence_parallel_state=None, recompute: bool = False
                       ) -> Optional[nn.Module]:
        """A block's norm at `place` ("input": on a sublayer's input, "output": on its output inside the residual
        branch), or None where --sublayer-norms puts none there."""
        wanted = self.sublayer_norms in (place, "input_and_output")
        return self.build(hidden_size, sequence_parallel_state, recompute) if wanted else None


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False) -> torch.Tensor:
    """RMSNorm keeping only its input (and the gain) for backward, the fp32 work done again there
    (gpt/recomputed.py): --recompute-modules layernorm's (RMSNorm(recompute=True)). Autograd through `rms_norm_math`
    keeps the input's fp32 copy and the normed values: of a 16-bit input 4 + 2 bytes a value (4 + 4 with
    `zero_centered`, whose normed values stay fp32), where this keeps the input's 2; of an fp32 input, the input and
    the normed values (4 + 4), where this keeps the input; for the price of the forward's 8 ops again in backward.
    The output and every gradient are bit-identical to autograd's through `rms_norm_math`
    (tests/gpt/test_saved_activations.py)."""
    if hidden.dtype == torch.float32:
        # `.float()` is then the input itself, which the product and the mean of squares read: autograd sends their
        # two gradients to the input's node one after the other (the product's first, after what reached it before,
        # the residual's), where the fp32 sums them in that order. So the input goes in twice, the product's first,
        # and the recompute's two gradients are summed there as before; a 16-bit input's two are summed in the
        # recompute itself, by its cast's backward, as before too.
        return recomputed_in_backward(
            lambda scaled, squared, gain: rms_norm_math(scaled, gain, eps, zero_centered, squared=squared),
            hidden, hidden, weight)
    return recomputed_in_backward(functools.partial(rms_norm_math, eps=eps, zero_centered=zero_centered),
                                  hidden, weight)


def rms_norm_math(hidden: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
                  squared: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * gain, x = `hidden` (in the mean of squares `squared`, the same values where given:
    rms_norm's fp32 input, passed twice)."""
    as_float = hidden.float()
    of_squares = as_float if squared is None else squared.float()
    normed = as_float * torch.rsqrt(of_squares.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        # --apply-layernorm-1p: Gemma's RMSNorm, `output * (1.0 + self.weight.float())` in fp32, then the cast
        return (normed * (1.0 + weight.float())).to(hidden.dtype)
    return weight * normed.to(hidden.dtype)


def _gain_init(zero_centered: bool) -> InitMethod:
    """A gain's initial value: 1, or with --apply-layernorm-1p its stored weight 0 (the gain 1 + 0)."""
    return InitMethod.zeros() if zero_centered else InitMethod.ones()


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * gain, computed in fp32 and cast back before the gain, as
    transformers' LlamaRMSNorm and Megatron-LM's legacy RMSNorm (`self._norm(x.float()).type_as(x) *
    self.weight`) do, so 16-bit runs round where theirs do. With `zero_centered` (--apply-layernorm-1p) the
    gain is 1 + weight, applied in fp32 before the cast, as Gemma's RMSNorm. With `recompute` (a block's input and
    pre-MLP norms under --recompute-modules layernorm) it keeps only its input for backward (rms_norm); otherwise its
    input and per-token rsqrt (gpt/rms_norm_backward.py, Transformer Engine's); the same values and gradients either
    way."""

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
    """LayerNorm with the gain 1 + weight (Megatron's zero-centered gamma), in fp32 and cast back."""
    return F.layer_norm(hidden.float(), shape, 1.0 + weight.float(), None if bias is None else bias.float(),
                        eps).to(hidden.dtype)


class SequenceParallelLayerNorm(nn.LayerNorm):
    """nn.LayerNorm over one slice of the sequence (`sequence_parallel_state`): gain and bias gradients summed over
    the TP group; or with `zero_centered` (--apply-layernorm-1p) the gain 1 + weight."""

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
    """`sequence_parallel_state`: the state whose TP group sums the gradients, when the norm runs on a
    slice of the sequence (None otherwise). `zero_centered`: --apply-layernorm-1p's gain 1 + weight. `recompute`: an
    RMSNorm keeps only its input and runs again in backward (--recompute-modules layernorm; a LayerNorm's aten kernel
    keeps its input and per-token statistics already)."""
    if kind == "RMSNorm":
        return RMSNorm(hidden_size, eps, sequence_parallel_state, zero_centered, recompute)
    return layer_norm(hidden_size, eps, sequence_parallel_state, zero_centered)


class HeadNorm(nn.Module):
    """--qk-layernorm's norm over each head's dims (Megatron-Core's q_layernorm / k_layernorm: the
    model's normalization at hidden size kv_channels). Its gain is one tensor shared by every head, and a
    TP rank holds only some heads, so each rank's gradient is a partial sum: the gain enters the
    tensor-parallel region through `copy`, whose backward all-reduces it over the TP group (Megatron
    all-reduces these gradients in finalize_model_grads instead). `zero_centered`: the gain 1 + weight (Gemma 3's
    q_norm and k_norm are its RMSNorm)."""

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
        if self.bias is None:  # autograd's saved tensors: Megatron-Core's selective recompute never takes these norms
            return rms_norm_math(heads, weight, self.eps, self.zero_centered)
        bias = copy_to_tensor_parallel_region(self.bias, self.state)
        if self.zero_centered:
            return zero_centered_layer_norm(heads, (self.head_dim,), weight, bias, self.eps)
        return F.layer_norm(heads, (self.head_dim,), weight, bias, self.eps)


class L2HeadNorm(nn.Module):
    """--qk-l2-norm: Megatron-Core's L2Norm (megatron/core/transformer/torch_norm.py @ d98e8a64) over each head,
    `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x)`: RMSNorm without a gain, so no parameter and
    nothing for tensor parallelism to sum."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        as_float = heads.float()
        return (as_float * torch.rsqrt(as_float.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(heads)


class ProjectionNorm(nn.Module):
    """--qk-layernorm-over-projection (OLMo 2's and OLMoE's q_norm / k_norm: transformers' Olmo2Attention normalizes
    q_proj's whole output, heads x head_dim wide, and k_proj's, before splitting it into heads): the model's
    normalization over the whole projection, its gain one weight per projected feature.

    Under tensor parallelism a rank holds its heads' features (whole key/value groups, gpt/model.py): the gain is
    split as the QKV rows are (its sharding record cut along dim 0), and the statistics over the whole projection are sums over
    the TP group, all-reduced in forward and in backward (each rank's features feed every rank's normalization).
    Megatron-Bridge's OLMoESelfAttention normalizes each partition's features alone instead, which equals the
    transformers model only at TP 1."""

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
        """The mean over the whole projection's last dim, of which this rank holds a slice."""
        if self.state.tensor_parallel_size == 1:
            return values.mean(-1, keepdim=True)
        total = copy_to_tensor_parallel_region(values.sum(-1, keepdim=True), self.state)
        return reduce_from_tensor_parallel_region(total, self.state) / self.width

    def forward(self, projected: torch.Tensor) -> torch.Tensor:
        """`projected` [..., this rank's features] -> the same shape, normalized over all ranks' features."""
        as_float = projected.float()
        gain = 1.0 + self.weight.float() if self.zero_centered else self.weight
        if self.bias is None:
            # the gain applied in fp32, then cast: Olmo2RMSNorm's `(self.weight * hidden_states).to(input_dtype)`
            normed = as_float * torch.rsqrt(self._mean(as_float.pow(2)) + self.eps)
            return (gain * normed).to(projected.dtype)
        centered = as_float - self._mean(as_float)
        normed = centered * torch.rsqrt(self._mean(centered.pow(2)) + self.eps)
        return (gain * normed + self.bias).to(projected.dtype)
