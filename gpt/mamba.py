"""Mamba-2, an `M` layer's mixer, as Megatron-Core's MambaMixer computes it: an input projection to [z, x, B, C, dt], a
causal conv and SiLU, the SSD chunked scan, a gated group RMSNorm and the output projection, initialized as
MambaMixer."""

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
from parallel.layers import entered_region, meta_parameter
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState

if TYPE_CHECKING:
    from data.documents import DocumentMasks
    from gpt.layer_spec import LayerSpec


class SplitParts(nn.Module):
    """Weights whose parts TP splits each on its own (in_proj's [z, x, B, C, dt], conv's [x, B, C]): one parameter per
    part, `<part>_<kind>`, joined for the one GEMM or conv."""

    def __init__(self, parts: dict[str, int], shape: tuple[int, ...], kinds: dict[str, InitMethod],
                 state: ParallelState):
        super().__init__()
        self.parts, self.kinds = tuple(parts), tuple(kinds)
        for part, size in parts.items():
            for kind, init in kinds.items():
                local = (size // state.tensor_parallel_size, *shape) if kind == "weight" else \
                    (size // state.tensor_parallel_size,)
                setattr(self, f"{part}_{kind}", meta_parameter(local, init, state, split_dim=0))

    def joined(self, kind: str) -> torch.Tensor:
        """This rank's parts of `kind` as one tensor, Megatron's local layout."""
        return torch.cat([getattr(self, f"{part}_{kind}") for part in self.parts])


class GatedGroupRMSNorm(nn.Module):
    """RMSNorm of y * silu(z) over each of `groups` slices, times a gain, in fp32 (Megatron's RMSNormGated)."""

    def __init__(self, width: int, groups: int, eps: float, state: ParallelState):
        super().__init__()
        self.groups, self.eps = groups, eps  # whole groups per rank: no reduction over TP
        self.weight = meta_parameter((width,), InitMethod.ones(), state, split_dim=0)

    def forward(self, hidden: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        gated = hidden.float() * F.silu(gate.float())
        grouped = gated.reshape(*gated.shape[:-1], self.groups, -1)
        normed = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.reshape(gated.shape).to(dtype)


class MambaMixer(nn.Module):
    """An `M` layer's mixer, parameters in MambaMixer's order. Under TP each rank holds its heads and groups and
    out_proj is row-parallel, as Megatron splits them."""

    # why generation over a KV cache cannot run through this mixer
    no_decoding_cache = "Mamba (`M`) layers keep no decoding state here (their convolution and scan state)"

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan):
        super().__init__()
        state = plan.state
        if state.context_parallel_size > 1:
            raise ConfigError(f"--context-parallel-size {state.context_parallel_size} with `M` (Mamba) layers: "
                              f"the scan and conv over a split sequence are not built; run them at CP 1",
                              flags=("--context-parallel-size", "--hybrid-layer-pattern"))
        settings, hidden, tp = config.mamba, config.hidden_size, state.tensor_parallel_size
        self.state, self.sequence_parallel = state, plan.sequence_parallel
        self.heads, self.head_dim = settings.heads(hidden) // tp, settings.mamba_head_dim
        self.groups, self.state_size = settings.mamba_num_groups // tp, settings.mamba_state_dim
        self.inner = self.heads * self.head_dim
        whole_inner, whole_bc = self.inner * tp, self.groups * tp * self.state_size
        conv_parts = {"x": whole_inner, "B": whole_bc, "C": whole_bc}
        self.in_proj = SplitParts({"z": whole_inner, **conv_parts, "dt": self.heads * tp}, (hidden,),
                                  {"weight": InitMethod.normal(config.init_method_std)}, state)
        bound = 1.0 / math.sqrt(MambaSettings.CONV_WIDTH)  # kaiming_uniform(a=sqrt(5)) over a fan-in of 1 x width
        self.conv1d = SplitParts(conv_parts, (1, MambaSettings.CONV_WIDTH),
                                 {"weight": InitMethod.uniform(-bound, bound),
                                  "bias": InitMethod.uniform(-bound, bound)},
                                 state)
        log_dt = (math.log(MambaSettings.DT_MIN), math.log(MambaSettings.DT_MAX))
        self.dt_bias = meta_parameter((self.heads,), InitMethod.uniform(
            *log_dt, then="exp_floor_inverse_softplus", floor=MambaSettings.DT_INIT_FLOOR), state, split_dim=0)
        self.A_log = meta_parameter((self.heads,), InitMethod.uniform(*MambaSettings.A_INIT_RANGE, then="log"),
                                    state, split_dim=0)
        self.D = meta_parameter((self.heads,), InitMethod.ones(), state, split_dim=0)
        self.norm = GatedGroupRMSNorm(self.inner, self.groups, MambaSettings.NORM_EPSILON, state)
        self.out_proj = plan.linear("attention.out_proj", whole_inner, hidden, init_std=config.output_init_std,
                                    bias=False)

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """[batch, seq, hidden] -> the same. `documents` is not read, as Megatron-Core's MambaMixer reads no mask; no
        decoding state is kept."""
        if cache is not None:
            raise ValueError(self.no_decoding_cache)
        with entered_region(hidden, self.state, self.sequence_parallel) as whole:
            projected = F.linear(whole, self.in_proj.joined("weight"))
        batch, seq, _ = projected.shape
        bc = self.groups * self.state_size
        z, xbc, dt = projected.split([self.inner, self.inner + 2 * bc, self.heads], dim=-1)
        width = MambaSettings.CONV_WIDTH
        xbc = F.conv1d(xbc.transpose(1, 2), self.conv1d.joined("weight"), self.conv1d.joined("bias"),
                       padding=width - 1, groups=xbc.shape[-1])[..., :seq].transpose(1, 2)
        x, b, c = F.silu(xbc).split([self.inner, bc, bc], dim=-1)
        y = ssd_scan(x.reshape(batch, seq, self.heads, self.head_dim), F.softplus(dt.float() + self.dt_bias.float()),
                     -torch.exp(self.A_log.float()), b.reshape(batch, seq, self.groups, self.state_size),
                     c.reshape(batch, seq, self.groups, self.state_size), self.D, MambaSettings.CHUNK_SIZE)
        return self.out_proj(self.norm(y.reshape(batch, seq, self.inner), z).to(hidden.dtype))


def build_mamba(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                spec: "LayerSpec", rotary_cache: Optional[RotaryCache]) -> MambaMixer:
    """An `M` layer's mixer; no dropout, window or rotary."""
    return MambaMixer(config, plan)
