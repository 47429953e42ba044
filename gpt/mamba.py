"""Mamba-2, an `M` layer's mixer, as Megatron-Core's MambaMixer computes it (megatron/core/ssm/mamba_mixer.py) and
transformers' NemotronHMamba2Mixer's torch path: one input projection to [z, x, B, C, dt]; a causal depthwise
convolution (width 4, with a bias) and SiLU over [x, B, C]; the SSD chunked scan (gpt/mamba_scan.py) with
dt = softplus(dt + dt_bias), A = -exp(A_log) and the skip D, one per head; the gated RMSNorm, norm(y * silu(z))
over each group's share of the width; the output projection. No biases in the projections, as MambaMixer asserts.

Initialisation as MambaMixer's: in_proj normal(--init-method-std), out_proj the residual branches' scaled std,
the conv's weight and bias uniform within 1/sqrt(width) (torch's Conv1d default, which Megatron keeps), A from
U[1, 16] kept as its log, dt_bias softplus's inverse of dt log-uniform in [dt_min, dt_max] (floored), D and the
norm's gain ones. Each is a function of the parameter's name (parallel/init.py), as every weight here.

Tensor parallelism (heads and groups split, out_proj row-parallel) and context parallelism are not built for it:
gpt/model_config.py refuses them beside an `M` layer in one line."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import nn

from base.errors import ConfigError
from gpt.kv_cache import LayerCache
from gpt.mamba_scan import ssd_scan
from gpt.mamba_settings import MambaSettings
from gpt.model_config import ModelConfig
from gpt.parallel_plan import TensorParallelPlan
from gpt.rotary import RotaryCache
from parallel.init import InitMethod
from parallel.layers import meta_parameter
from parallel.random import TensorParallelRNG

if TYPE_CHECKING:
    from data.documents import DocumentMasks
    from gpt.layer_spec import LayerSpec


class CausalDepthwiseConv(nn.Module):
    """Each channel convolved with its own `width` taps over itself and the width - 1 tokens before it."""

    def __init__(self, channels: int, width: int):
        super().__init__()
        bound = 1.0 / math.sqrt(width)  # kaiming_uniform(a=sqrt(5)) over a fan-in of 1 x width, and the bias's
        self.weight = meta_parameter((channels, 1, width), InitMethod.uniform(-bound, bound))
        self.bias = meta_parameter((channels,), InitMethod.uniform(-bound, bound))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[batch, seq, channels] -> the same, position t reading t - width + 1 .. t."""
        seq, width = hidden.shape[1], self.weight.shape[-1]
        out = F.conv1d(hidden.transpose(1, 2), self.weight, self.bias, padding=width - 1, groups=hidden.shape[-1])
        return out[..., :seq].transpose(1, 2)


class GatedGroupRMSNorm(nn.Module):
    """RMSNorm of y * silu(z) over each of `groups` equal slices of the width, times a gain, in fp32 (Megatron's
    RMSNormGated with norm_before_gate False and group_size d_inner / ngroups)."""

    def __init__(self, width: int, groups: int, eps: float):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = meta_parameter((width,), InitMethod.ones())

    def forward(self, hidden: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        gated = hidden.float() * F.silu(gate.float())
        grouped = gated.reshape(*gated.shape[:-1], self.groups, -1)
        normed = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.reshape(gated.shape).to(dtype)


class MambaMixer(nn.Module):
    """An `M` layer's mixer; its parameters in MambaMixer's order and names (conv1d's as transformers' Conv1d)."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan):
        super().__init__()
        if plan.state.context_parallel_size > 1:
            raise ConfigError(f"--context-parallel-size {plan.state.context_parallel_size} with `M` (Mamba) layers: "
                              f"the scan and conv over a split sequence are not built; run them at CP 1",
                              flags=("--context-parallel-size", "--hybrid-layer-pattern"))
        settings, hidden = config.mamba, config.hidden_size
        self.heads, self.head_dim = settings.heads(hidden), settings.mamba_head_dim
        self.groups, self.state = settings.mamba_num_groups, settings.mamba_state_dim
        self.inner = self.heads * self.head_dim
        self.conv_channels = self.inner + 2 * self.groups * self.state  # x, B, C
        self.in_proj = plan.linear("mamba.in_proj", hidden, self.inner + self.conv_channels + self.heads,
                                   init_std=config.init_method_std, bias=False)
        self.conv1d = CausalDepthwiseConv(self.conv_channels, MambaSettings.CONV_WIDTH)
        log_dt = (math.log(MambaSettings.DT_MIN), math.log(MambaSettings.DT_MAX))
        self.dt_bias = meta_parameter((self.heads,), InitMethod.uniform(
            *log_dt, then="exp_floor_inverse_softplus", floor=MambaSettings.DT_INIT_FLOOR))
        self.A_log = meta_parameter((self.heads,), InitMethod.uniform(*MambaSettings.A_INIT_RANGE, then="log"))
        self.D = meta_parameter((self.heads,), InitMethod.ones())
        self.norm = GatedGroupRMSNorm(self.inner, self.groups, MambaSettings.NORM_EPSILON)
        self.out_proj = plan.linear("mamba.out_proj", self.inner, hidden, init_std=config.output_init_std, bias=False)

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """[batch, seq, hidden] -> the same. `documents`: not read, as Megatron-Core's MambaMixer reads no attention
        mask (the state runs on across a document boundary); a KV cache (generation) has no Mamba state here."""
        if cache is not None:
            raise ValueError("generation through `M` (Mamba) layers is not built: they keep no recurrent state cache")
        batch, seq, _ = hidden.shape
        z, xbc, dt = self.in_proj(hidden).split([self.inner, self.conv_channels, self.heads], dim=-1)
        x, b, c = F.silu(self.conv1d(xbc)).split([self.inner, self.groups * self.state, self.groups * self.state],
                                                 dim=-1)
        y = ssd_scan(x.reshape(batch, seq, self.heads, self.head_dim), F.softplus(dt.float() + self.dt_bias.float()),
                     -torch.exp(self.A_log.float()), b.reshape(batch, seq, self.groups, self.state),
                     c.reshape(batch, seq, self.groups, self.state), self.D, MambaSettings.CHUNK_SIZE)
        return self.out_proj(self.norm(y.reshape(batch, seq, self.inner), z).to(hidden.dtype))


def build_mamba(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                spec: "LayerSpec", rotary_cache: Optional[RotaryCache]) -> MambaMixer:
    """An `M` layer's mixer (gpt/layer_spec.py); it has no dropout stream, window or rotary."""
    return MambaMixer(config, plan)
