"""Gated DeltaNet, a `G` layer's mixer, as Megatron-Core 0.19's GatedDeltaNet computes it on its torch path (the math of
transformers' Qwen3NextGatedDeltaNet): projections, a causal depthwise conv and SiLU, L2-normalized queries and keys,
the chunked gated delta rule, a gated norm and the output projection."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import nn

from base.errors import ConfigError
from gpt.kv_cache import LayerCache
from gpt.model_config import ModelConfig
from gpt.norms import HeadNorm
from gpt.parallel_plan import TensorParallelPlan
from parallel.init import InitMethod
from parallel.layers import meta_parameter
from parallel.random import TensorParallelRNG

if TYPE_CHECKING:
    from data.documents import DocumentMasks

CHUNK_SIZE = 64  # Megatron-Core's and transformers' torch_chunk_gated_delta_rule
A_LOG_INIT_RANGE = (1.0, 16.0)
L2NORM_EPS = 1e-6  # fla's l2norm


def l2_normalized(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the head's dims, in fp32 and cast back."""
    x32 = x.float()
    return (x32 * torch.rsqrt((x32 * x32).sum(dim=-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)


def chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> torch.Tensor:
    """The gated delta rule's outputs [batch, seq, heads, value dim] from normalized query and key, values, log decays g
    and rates beta; in fp32 from a zero state."""
    dtype, seq = query.dtype, query.shape[1]
    query, key, value, beta, g = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))
    query = query * query.shape[-1] ** -0.5
    pad = (chunk_size - seq % chunk_size) % chunk_size  # zero rows at the end change no earlier output
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    batch, heads, length, _ = key.shape
    chunks = length // chunk_size

    def chunked(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(batch, heads, chunks, chunk_size, x.shape[-1])

    k_beta, v_beta = chunked(key * beta.unsqueeze(-1)), chunked(value * beta.unsqueeze(-1))
    query, key = chunked(query), chunked(key)
    decay = g.reshape(batch, heads, chunks, chunk_size).cumsum(dim=-1)
    later = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(later, float("-inf")).exp()
    # within a chunk the delta rule's updates are one unit lower-triangular system (the UT transform)
    system = (k_beta @ key.transpose(-1, -2)) * pairwise
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, k_beta * decay.exp().unsqueeze(-1), upper=False,
                                               unitriangular=True)
    intra = (query @ key.transpose(-1, -2)) * pairwise
    query = query * decay.exp().unsqueeze(-1)
    key = key * (decay[..., -1:] - decay).exp().unsqueeze(-1)
    state = query.new_zeros(batch, heads, query.shape[-1], value.shape[-1])
    outputs = []
    for i in range(chunks):  # the state carries each chunk's writes to the next
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        outputs.append(query[:, :, i] @ state + intra[:, :, i] @ v_new)
        state = state * decay[:, :, i, -1, None, None].exp() + key[:, :, i].transpose(-1, -2) @ v_new
    out = torch.stack(outputs, dim=2).reshape(batch, heads, length, -1)[:, :, :seq]
    return out.transpose(1, 2).contiguous().to(dtype)


class CausalConv1d(nn.Module):
    """Depthwise causal conv over the sequence (Megatron's `conv1d`, no bias, nn.Conv1d's default init); [batch, seq,
    channels]."""

    def __init__(self, channels: int, width: int, plan: TensorParallelPlan):
        super().__init__()
        bound = 1.0 / math.sqrt(width)
        self.weight = meta_parameter((channels, 1, width), InitMethod.uniform(-bound, bound), plan.state,
                                     split_dim=0)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        seq, width = hidden.shape[1], self.weight.shape[-1]
        out = F.conv1d(hidden.transpose(1, 2), self.weight, padding=width - 1, groups=self.weight.shape[0])
        return out[..., :seq].transpose(1, 2)


class GatedDeltaNet(nn.Module):
    """Megatron-Core's GatedDeltaNet, its parameters named as there. in_proj's rows and conv1d's channels lie per
    query/key head with its value heads, so TP splits whole heads and a rank's rows are the same at any TP size."""

    # why generation over a KV cache cannot run through this mixer
    no_decoding_cache = "Gated DeltaNet (`G`) layers keep no decoding state here (their convolution and recurrent state)"

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan):
        super().__init__()
        gdn, h, tp = config.gdn, config.hidden_size, plan.state.tensor_parallel_size
        self.key_head_dim, self.value_head_dim = gdn.linear_key_head_dim, gdn.linear_value_head_dim
        self.group = gdn.linear_num_value_heads // gdn.linear_num_key_heads  # value heads per query/key head
        self.local_key_heads = gdn.linear_num_key_heads // tp
        dk, group_v = self.key_head_dim, self.group * self.value_head_dim
        self.per_head = [2 * dk + group_v, group_v, self.group, self.group]  # conv's q k v, then z, beta, alpha
        self.in_proj = plan.linear("attention.in_proj", h, gdn.linear_num_key_heads * sum(self.per_head),
                                   init_std=config.init_method_std, bias=False)
        self.conv1d = CausalConv1d(self.local_key_heads * self.per_head[0], gdn.linear_conv_kernel_dim, plan)
        local_value_heads = self.local_key_heads * self.group
        self.dt_bias = meta_parameter((local_value_heads,), InitMethod.ones(), plan.state, split_dim=0)
        self.A_log = meta_parameter((local_value_heads,), InitMethod.uniform(*A_LOG_INIT_RANGE, then="log"),
                                    plan.state, split_dim=0)
        norms = config.norms  # one gain over each value head's dims, its gradient summed over TP
        self.out_norm = HeadNorm(norms.normalization, self.value_head_dim, norms.layernorm_epsilon, plan.state,
                                 norms.apply_layernorm_1p)
        self.out_proj = plan.linear("attention.out_proj", gdn.linear_num_value_heads * self.value_head_dim, h,
                                    init_std=config.output_init_std, bias=False)

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`documents` is not read (Megatron-Core's takes no mask); no KV cache is kept."""
        if cache is not None:
            raise ValueError(self.no_decoding_cache)
        projected = self.in_proj(hidden)
        batch, seq, heads = projected.shape[0], projected.shape[1], self.local_key_heads
        qkv, gate, beta, alpha = projected.view(batch, seq, heads, -1).split(self.per_head, dim=-1)
        qkv = F.silu(self.conv1d(qkv.reshape(batch, seq, -1))).view(batch, seq, heads, -1)
        dk = self.key_head_dim
        query, key, value = qkv.split([dk, dk, self.group * self.value_head_dim], dim=-1)
        query, key = (l2_normalized(x).repeat_interleave(self.group, dim=2) for x in (query, key))
        value, gate = (x.reshape(batch, seq, heads * self.group, self.value_head_dim) for x in (value, gate))
        beta, alpha = (x.reshape(batch, seq, heads * self.group) for x in (beta, alpha))
        g = -self.A_log.float().exp() * F.softplus(alpha.float() + self.dt_bias)  # in fp32, as Megatron's
        out = chunk_gated_delta_rule(query, key, value, g, beta.sigmoid())
        out = (self.out_norm(out) * F.silu(gate.float())).to(hidden.dtype)
        return self.out_proj(out.reshape(batch, seq, -1))


def build_gated_delta_net(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG], spec,
                          rotary_cache) -> GatedDeltaNet:
    """A `G` layer's Gated DeltaNet: no positions, no dropout."""
    if plan.state.context_parallel_size > 1:  # Megatron-Core: "TODO: support CP"
        raise ConfigError(f"--context-parallel-size {plan.state.context_parallel_size} with Gated DeltaNet layers "
                          f"(`G`) is not implemented (nor in Megatron-Core): their state runs over the whole "
                          f"sequence; train them without context parallelism", flags=("--context-parallel-size",))
    return GatedDeltaNet(config, plan)
