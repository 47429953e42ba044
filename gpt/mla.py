"""Multi-latent attention (DeepSeek-V2/V3, --multi-latent-attention) as Megatron-Core's MLASelfAttention computes it:
queries through an optional low-rank projection, keys and values from one compressed latent, and a shared rotated
positional key part with YaRN scaling."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import nn

from gpt.attention_backend import attention_kernels
from gpt.attention_padding import FUSED_CAPABLE_BACKENDS
from gpt.attention_sinks import attention_with_sinks, sink_logits
from gpt.cp_attention import context_parallel_attention
from gpt.kv_cache import LayerCache
from gpt.model_config import ModelConfig
from gpt.norms import _summed_over_sequence_slices, normalization
from gpt.parallel_plan import TensorParallelPlan
from gpt.rotary import RotaryCache, apply_rotary, inverse_frequencies, yarn_angles, yarn_get_mscale
from parallel.context_parallel import positions_on_this_rank
from parallel.init import InitMethod
from parallel.layers import meta_parameter
from parallel.mappings import copy_to_tensor_parallel_region, gather_from_sequence_parallel_region
from parallel.random import TensorParallelRNG, dropout_stream

if TYPE_CHECKING:
    from data.documents import DocumentMasks

# MLATransformerConfig's YaRN defaults, which no Megatron-LM flag reaches
MLA_YARN_BETA_FAST = 32.0
MLA_YARN_BETA_SLOW = 1.0
MLA_YARN_ORIGINAL_MAX_POSITIONS = 4096


def mla_rotary_angles(config: ModelConfig, seq_length: int, device: torch.device
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq, qk_pos_emb_head_dim] in fp32, YaRN's mscale included."""
    dim = config.mla.qk_pos_emb_head_dim
    if config.mla.rope_type in (None, "yarn"):
        return yarn_angles(seq_length, dim, config.positions.rotary_base, device, config.positions.rotary_scaling_factor,
                           MLA_YARN_ORIGINAL_MAX_POSITIONS, MLA_YARN_BETA_FAST, MLA_YARN_BETA_SLOW,
                           round_to_int=True, mscale=config.positions.mscale, mscale_all_dim=config.positions.mscale_all_dim)
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float32, device=device),
                         inverse_frequencies(dim, config.positions.rotary_base, device))
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def mla_softmax_scale(config: ModelConfig) -> float:
    """`mscale^2 / sqrt(q_head_dim)`, as MultiLatentAttention.__init__, whatever the rope type."""
    mscale = yarn_get_mscale(config.positions.rotary_scaling_factor, config.positions.mscale_all_dim)
    return mscale * mscale / math.sqrt(config.mla.qk_head_dim + config.mla.qk_pos_emb_head_dim)


class ReplicatedLinear(nn.Module):
    """A down projection, whole on every TP rank (Megatron's duplicated linear_*_down_proj); under sequence parallelism
    its gradient sums over TP."""

    def __init__(self, in_features: int, out_features: int, init_std: float, sequence_parallel_state):
        super().__init__()
        self.weight = meta_parameter((out_features, in_features), InitMethod.normal(init_std))
        self.weight.sequence_parallel = sequence_parallel_state is not None
        self.sequence_parallel_state = sequence_parallel_state

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, _summed_over_sequence_slices(self.weight, self.sequence_parallel_state))


class MLASelfAttention(nn.Module):
    """Megatron-Core's MLASelfAttention; tensors [batch, seq, hidden]."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 output_init_std: float, rotary_cache: Optional[RotaryCache] = None):
        super().__init__()
        self.rng, self.state, self.config = rng, plan.state, config
        self.rotary_cache = rotary_cache if rotary_cache is not None else RotaryCache()
        tp = plan.state.tensor_parallel_size
        self.heads_per_rank = config.num_attention_heads // tp
        self.q_head_dim = config.mla.qk_head_dim + config.mla.qk_pos_emb_head_dim
        self.softmax_scale = mla_softmax_scale(config)
        self.dropout_p = config.attention.attention_dropout
        self.attention_backend = config.attention.attention_backend
        self.context_parallel = plan.state if plan.state.context_parallel_size > 1 else None
        self.cp_comm_type = config.attention.cp_comm_type
        h, std, heads = config.hidden_size, config.init_method_std, config.num_attention_heads
        # down projections and latent norms run on the sequence slice
        latent_state = plan.norm_state("input_layernorm")
        self.sequence_parallel = latent_state is not None
        norm = (lambda size: normalization(config.norms.normalization, size, config.norms.layernorm_epsilon, latent_state,
                                           config.norms.apply_layernorm_1p)) if config.attention.qk_layernorm else None
        if config.mla.q_lora_rank is None:
            # with --qk-layernorm Megatron fuses a norm over the hidden state into linear_q_proj
            self.q_layernorm = norm(h) if norm else None
            self.linear_q_down_proj = None
            self.linear_q_proj = plan.linear("attention.linear_q_proj", h, heads * self.q_head_dim, init_std=std,
                                             bias=False)
        else:
            self.linear_q_down_proj = ReplicatedLinear(h, config.mla.q_lora_rank, std, latent_state)
            self.q_layernorm = norm(config.mla.q_lora_rank) if norm else None
            self.linear_q_up_proj = plan.linear("attention.linear_q_up_proj", config.mla.q_lora_rank,
                                                heads * self.q_head_dim, init_std=std, bias=False)
        self.linear_kv_down_proj = ReplicatedLinear(h, config.mla.kv_lora_rank + config.mla.qk_pos_emb_head_dim, std,
                                                     latent_state)
        self.kv_layernorm = norm(config.mla.kv_lora_rank) if norm else None
        self.linear_kv_up_proj = plan.linear("attention.linear_kv_up_proj", config.mla.kv_lora_rank,
                                             heads * (config.mla.qk_head_dim + config.mla.v_head_dim), init_std=std,
                                             bias=False)
        self.linear_proj = plan.linear("attention.linear_proj", heads * config.mla.v_head_dim, h,
                                       init_std=output_init_std, bias=config.add_bias_linear)
        self.softmax_type = config.attention.softmax_type
        if self.softmax_type == "learnable":
            self.softmax_offset = meta_parameter((self.heads_per_rank,), InitMethod.normal(std), plan.state,
                                                 split_dim=0)
        else:
            self.softmax_offset = None

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`cache`: `hidden` is the tokens after those cached; the cache keeps each head's whole key and value, as
        Megatron-Core's MLA caches them."""
        config, state = self.config, self.state
        if self.linear_q_down_proj is None:
            q_compressed = hidden
            q_compressed = self.q_layernorm(q_compressed) if self.q_layernorm is not None else q_compressed
            query = self.linear_q_proj(q_compressed)
        else:
            q_compressed = self.linear_q_down_proj(hidden)
            q_compressed = self.q_layernorm(q_compressed) if self.q_layernorm is not None else q_compressed
            query = self.linear_q_up_proj(q_compressed)
        kv_compressed, k_pos = self.linear_kv_down_proj(hidden).split(
            [config.mla.kv_lora_rank, config.mla.qk_pos_emb_head_dim], dim=-1)
        if self.kv_layernorm is not None:
            kv_compressed = self.kv_layernorm(kv_compressed)
        kv = self.linear_kv_up_proj(kv_compressed)
        # the positional key serves every head of every rank: its gradient sums over TP
        k_pos = gather_from_sequence_parallel_region(k_pos, state) if self.sequence_parallel \
            else copy_to_tensor_parallel_region(k_pos, state)
        batch, seq, _ = query.shape
        query = query.view(batch, seq, self.heads_per_rank, self.q_head_dim).transpose(1, 2)
        kv = kv.view(batch, seq, self.heads_per_rank, config.mla.qk_head_dim + config.mla.v_head_dim).transpose(1, 2)
        q_nope, q_pos = query.split([config.mla.qk_head_dim, config.mla.qk_pos_emb_head_dim], dim=-1)
        k_nope, value = kv.split([config.mla.qk_head_dim, config.mla.v_head_dim], dim=-1)
        cos, sin = self._cos_sin(seq, hidden.device, q_pos.dtype, cache)
        q_pos = apply_rotary(_deinterleaved(q_pos), cos, sin)
        k_pos = apply_rotary(_deinterleaved(k_pos.unsqueeze(1)), cos, sin)
        query = torch.cat((q_nope, q_pos), dim=-1)
        key = torch.cat((k_nope, k_pos.expand(-1, self.heads_per_rank, -1, -1)), dim=-1)
        attention_mask = documents.attention_mask if documents is not None else None
        if cache is not None:  # the new tokens' queries over every cached key
            key, value = cache.extend(key, value)
            attention_mask = cache.visible(seq, None, query.device)
        dropout_p = self.dropout_p if self.training else 0.0
        pad_value = value_needs_padding(self.attention_backend, query.device.type, self.q_head_dim, config.mla.v_head_dim)
        with dropout_stream(self.rng), attention_kernels(self.attention_backend):
            if self.context_parallel is not None:
                context = self._context_parallel_attention(query, key, value, documents, dropout_p, pad_value)
            elif self.softmax_type != "vanilla":
                context = attention_with_sinks(query, key, value, sink_logits(self.softmax_offset, self.heads_per_rank,
                                                                              query),
                                               dropout_p, attention_mask=attention_mask, scale=self.softmax_scale)
            else:
                context = mla_core_attention(query, key, value, self.softmax_scale, dropout_p, attention_mask,
                                             pad_value)
        context = context.transpose(1, 2).reshape(batch, seq, self.heads_per_rank * config.mla.v_head_dim)
        return self.linear_proj(context)

    def _cos_sin(self, seq: int, device: torch.device, dtype: torch.dtype, cache: Optional[LayerCache]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the `seq` tokens, or the new tokens' with a cache."""
        length = seq if cache is None else cache.capacity
        cos, sin = self.rotary_cache.angles(self._rotary_key(length, device), dtype,
                                            lambda: self._rotary_angles(length, device))
        return (cos, sin) if cache is None else (cos[cache.start:cache.start + seq], sin[cache.start:cache.start + seq])

    def _rotary_key(self, seq: int, device: torch.device) -> tuple:
        cp, config = self.context_parallel, self.config
        return ("mla", config.mla.qk_pos_emb_head_dim, config.mla.rope_type, config.positions.rotary_base, config.positions.rotary_scaling_factor,
                config.positions.mscale, config.positions.mscale_all_dim, seq, str(device),
                None if cp is None else (cp.context_parallel_size, cp.context_parallel_rank))

    def _rotary_angles(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of this rank's tokens at their global positions under context parallelism."""
        if self.context_parallel is None:
            return mla_rotary_angles(self.config, seq, device)
        cos, sin = mla_rotary_angles(self.config, seq * self.context_parallel.context_parallel_size, device)
        positions = positions_on_this_rank(seq, self.context_parallel, device)
        return cos[positions], sin[positions]

    def _context_parallel_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                    documents: Optional[DocumentMasks], dropout_p: float,
                                    pad_value: bool) -> torch.Tensor:
        """Over the whole sequence by --cp-comm-type, at MLA's softmax scale; values at their own width through the
        exchanges."""
        sinks = None if self.softmax_type == "vanilla" else sink_logits(self.softmax_offset, self.heads_per_rank, query)
        return context_parallel_attention(query, key, value, self.context_parallel, self.cp_comm_type, dropout_p,
                                          scale=self.softmax_scale, sinks=sinks,
                                          document_ids=documents.document_ids if documents is not None else None,
                                          pad_value=pad_value)


def value_needs_padding(backend: str, device_type: str, q_head_dim: int, v_head_dim: int) -> bool:
    """Whether value heads are zero-padded to the query width, as Megatron-Core pads V: SDPA's flash kernel needs one
    head width for q, k and v. The zero columns change no weight."""
    if v_head_dim == q_head_dim:
        return False
    return backend == "flash" or (device_type == "cuda" and backend in FUSED_CAPABLE_BACKENDS)


def mla_core_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, dropout_p: float,
                       attention_mask: Optional[torch.Tensor], pad_value: bool) -> torch.Tensor:
    """Causal (or masked) SDPA at `scale`; with `pad_value` the values zero-padded to the query width and the context
    cut back."""
    masking = {"is_causal": True} if attention_mask is None else {"attn_mask": attention_mask}
    v_head_dim = value.shape[-1]
    if pad_value:
        value = F.pad(value, (0, query.shape[-1] - v_head_dim))
    context = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, scale=scale, **masking)
    return context[..., :v_head_dim] if pad_value else context


def _deinterleaved(x: torch.Tensor) -> torch.Tensor:
    """Megatron's interleaved rope: (x[0::2], x[1::2]) then halves rotate."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def build_mla(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG], spec,
              rotary_cache: Optional[RotaryCache]) -> MLASelfAttention:
    """A `+` layer's multi-latent attention: whole causal context, always rotating."""
    return MLASelfAttention(config, plan, rng, config.output_init_std, rotary_cache=rotary_cache)
