"""Multi-latent attention (DeepSeek-V2/V3), as Megatron-Core's MLASelfAttention computes it
(megatron/core/transformer/multi_latent_attention.py; Megatron-LM's --multi-latent-attention).

The query comes through `linear_q_proj` (no --q-lora-rank) or a low-rank `linear_q_down_proj` (hidden ->
q_lora_rank), a norm and `linear_q_up_proj` (-> heads x (qk_head_dim + qk_pos_emb_head_dim)). Key and value come
from one latent: `linear_kv_down_proj` (hidden -> kv_lora_rank + qk_pos_emb_head_dim) splits into the compressed kv
(normed, then `linear_kv_up_proj` -> heads x (qk_head_dim + v_head_dim)) and one positional key shared by every
head. Rotary turns only the positional parts (de-interleaved first: _apply_rotary_pos_emb_bshd with
mla_rotary_interleaved); heads are [nope, pos], values v_head_dim wide, and the softmax scale is
mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim). The latent norms are
the model's --normalization and exist only under --qk-layernorm (QKNormConfigResolver; without --q-lora-rank the
query's norm is over the hidden state before linear_q_proj). --rope-type yarn (MLATransformerConfig's default) is
YarnRotaryEmbedding with --rotary-scaling-factor, --mscale, --mscale-all-dim, beta_fast 32, beta_slow 1, original
max positions 4096 (the --yarn-* flags set a non-MLA model's); --rope-type rope is RotaryEmbedding. TP splits the heads: the up projections (and linear_q_proj) column-parallel, linear_proj row-parallel; the down
projections and latent norms replicated, on this rank's sequence slice under SP, their gradients summed over TP
(Megatron's duplicated down projections, all-reduced as sequence-parallel parameters). CP (every --cp-comm-type):
everything before attention is per token on this rank's two chunks, the rotary angles the whole sequence's at the
chunks' global positions, and attention runs through gpt/cp_attention.py at MLA's scale with values at v_head_dim
(as TE's context-parallel attention takes a value width of its own under Megatron-Core's MLA)."""

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

# MLATransformerConfig's YaRN defaults, which no Megatron-LM flag reaches for MLA (megatron/core/transformer/
# transformer_config.py): beta_fast, beta_slow, original_max_position_embeddings
MLA_YARN_BETA_FAST = 32.0
MLA_YARN_BETA_SLOW = 1.0
MLA_YARN_ORIGINAL_MAX_POSITIONS = 4096


def mla_rotary_angles(config: ModelConfig, seq_length: int, device: torch.device
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq, qk_pos_emb_head_dim] in fp32, YaRN's concentration factor included (Megatron-Core's
    apply_rotary_pos_emb multiplies cos and sin by the mscale YarnRotaryEmbedding returns)."""
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
    """MultiLatentAttention.__init__: `mscale * mscale / math.sqrt(self.q_head_dim)`, mscale =
    _yarn_get_mscale(rotary_scaling_factor, mscale_all_dim) whatever the rope type."""
    mscale = yarn_get_mscale(config.positions.rotary_scaling_factor, config.positions.mscale_all_dim)
    return mscale * mscale / math.sqrt(config.mla.qk_head_dim + config.mla.qk_pos_emb_head_dim)


class ReplicatedLinear(nn.Module):
    """A down projection, whole on every TP rank, no bias (Megatron's duplicated linear_*_down_proj): under
    sequence parallelism it sees this rank's slice of the sequence and its gradient is summed over the TP group."""

    def __init__(self, in_features: int, out_features: int, init_std: float, sequence_parallel_state):
        super().__init__()
        self.weight = meta_parameter((out_features, in_features), InitMethod.normal(init_std))
        self.weight.sequence_parallel = sequence_parallel_state is not None
        self.sequence_parallel_state = sequence_parallel_state

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, _summed_over_sequence_slices(self.weight, self.sequence_parallel_state))


class MLASelfAttention(nn.Module):
    """Megatron-Core's MLASelfAttention (see the module's docstring); tensors [batch, seq, hidden]."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 output_init_std: float, rotary_cache: Optional[RotaryCache] = None):
        """`rotary_cache`: the model's cos and sin, shared by its layers (gpt/rotary.py; None: this layer's own)."""
        super().__init__()
        self.rng, self.state, self.config = rng, plan.state, config
        self.rotary_cache = rotary_cache if rotary_cache is not None else RotaryCache()
        tp = plan.state.tensor_parallel_size
        self.heads_per_rank = config.num_attention_heads // tp
        self.q_head_dim = config.mla.qk_head_dim + config.mla.qk_pos_emb_head_dim
        self.softmax_scale = mla_softmax_scale(config)
        self.dropout_p = config.attention.attention_dropout
        self.attention_backend = config.attention.attention_backend
        # under context parallelism the sequence here is this rank's two chunks (parallel/context_parallel.py)
        self.context_parallel = plan.state if plan.state.context_parallel_size > 1 else None
        self.cp_comm_type = config.attention.cp_comm_type
        h, std, heads = config.hidden_size, config.init_method_std, config.num_attention_heads
        # the down projections and the latent norms run where the input layernorm's output is: the sequence slice
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
        # --softmax-type: attention sinks (gpt/attention_sinks.py), as SelfAttention's
        self.softmax_type = config.attention.softmax_type
        if self.softmax_type == "learnable":
            self.softmax_offset = meta_parameter((self.heads_per_rank,), InitMethod.normal(std), plan.state,
                                                 split_dim=0)
        else:
            self.softmax_offset = None

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`cache` (gpt/kv_cache.py): `hidden` is the tokens after those the cache holds, as SelfAttention's; the
        cache keeps each head's whole key (its rotated positional part included) and value, as Megatron-Core's MLA
        caches them without the absorbed up-projections."""
        config, state = self.config, self.state
        if self.linear_q_down_proj is None:
            q_compressed = hidden
            q_compressed = self.q_layernorm(q_compressed) if self.q_layernorm is not None else q_compressed
            query = self.linear_q_proj(q_compressed)
        else:
            q_compressed = self.linear_q_down_proj(hidden)
            q_compressed = self.q_layernorm(q_compressed) if self.q_layernorm is not None else q_compressed
            query = self.linear_q_up_proj(q_compressed)  # under sequence parallelism: gathers the sequence
        kv_compressed, k_pos = self.linear_kv_down_proj(hidden).split(
            [config.mla.kv_lora_rank, config.mla.qk_pos_emb_head_dim], dim=-1)
        if self.kv_layernorm is not None:
            kv_compressed = self.kv_layernorm(kv_compressed)
        kv = self.linear_kv_up_proj(kv_compressed)
        # the positional key serves every head of every rank: its gradient is summed over the TP group (gathered
        # along the sequence under sequence parallelism, whose backward reduce-scatters)
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
        if cache is not None:  # the new tokens' queries over every cached key, causal by position
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
        """cos and sin of the `seq` tokens: positions 0..seq-1, or with a KV cache the new tokens' positions, cut from
        the angles of the cache's every position."""
        length = seq if cache is None else cache.capacity
        cos, sin = self.rotary_cache.angles(self._rotary_key(length, device), dtype,
                                            lambda: self._rotary_angles(length, device))
        return (cos, sin) if cache is None else (cos[cache.start:cache.start + seq], sin[cache.start:cache.start + seq])

    def _rotary_key(self, seq: int, device: torch.device) -> tuple:
        """What decides this layer's cos and sin besides their dtype (RotaryCache's key): MLA's rotary settings (those
        mla_rotary_angles reads), the length, this rank's place in the sequence and the device."""
        cp, config = self.context_parallel, self.config
        return ("mla", config.mla.qk_pos_emb_head_dim, config.mla.rope_type, config.positions.rotary_base, config.positions.rotary_scaling_factor,
                config.positions.mscale, config.positions.mscale_all_dim, seq, str(device),
                None if cp is None else (cp.context_parallel_size, cp.context_parallel_rank))

    def _rotary_angles(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of this rank's tokens: under context parallelism the whole sequence's at their global
        positions (Megatron-Core's rotary embeddings with cp_group: get_pos_emb_on_this_cp_rank)."""
        if self.context_parallel is None:
            return mla_rotary_angles(self.config, seq, device)
        cos, sin = mla_rotary_angles(self.config, seq * self.context_parallel.context_parallel_size, device)
        positions = positions_on_this_rank(seq, self.context_parallel, device)
        return cos[positions], sin[positions]

    def _context_parallel_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                    documents: Optional[DocumentMasks], dropout_p: float,
                                    pad_value: bool) -> torch.Tensor:
        """Over the whole sequence by --cp-comm-type (gpt/cp_attention.py), at MLA's softmax scale, the values at
        their own width through the exchanges and padded only at an SDPA call where `pad_value` says (as at CP 1);
        the ring computes its blocks itself."""
        sinks = None if self.softmax_type == "vanilla" else sink_logits(self.softmax_offset, self.heads_per_rank, query)
        return context_parallel_attention(query, key, value, self.context_parallel, self.cp_comm_type, dropout_p,
                                          scale=self.softmax_scale, sinks=sinks,
                                          document_ids=documents.document_ids if documents is not None else None,
                                          pad_value=pad_value)


def value_needs_padding(backend: str, device_type: str, q_head_dim: int, v_head_dim: int) -> bool:
    """Whether the value heads are zero-padded to the query/key width, as Megatron-Core pads V for its THD kernels
    (_prepare_mla_core_attention_value): SDPA's flash kernel takes one head width for q, k and v on every device
    (its CPU kernel too: `--use-flash-attn` with MLA's 192-wide queries and 128-wide values ended in "No available
    kernel" there, issue 60), and on CUDA a fused kernel may run under auto. Under auto on a CPU, or the math
    kernel, they are taken as they are. The zero columns change no weight and no kept column: the same numbers."""
    if v_head_dim == q_head_dim:
        return False
    return backend == "flash" or (device_type == "cuda" and backend in FUSED_CAPABLE_BACKENDS)


def mla_core_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, dropout_p: float,
                       attention_mask: Optional[torch.Tensor], pad_value: bool) -> torch.Tensor:
    """Causal (or `attention_mask`ed) SDPA at `scale`, [batch, heads, seq, d]; with `pad_value` the values padded
    with zero columns to the query's width and the context cut back: the same weights times the same values."""
    masking = {"is_causal": True} if attention_mask is None else {"attn_mask": attention_mask}
    v_head_dim = value.shape[-1]
    if pad_value:
        value = F.pad(value, (0, query.shape[-1] - v_head_dim))
    context = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, scale=scale, **masking)
    return context[..., :v_head_dim] if pad_value else context


def _deinterleaved(x: torch.Tensor) -> torch.Tensor:
    """rope_utils._apply_rotary_pos_emb_bshd with mla_rotary_interleaved: (x[0::2], x[1::2]) then halves rotate."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def build_mla(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG], spec,
              rotary_cache: Optional[RotaryCache]) -> MLASelfAttention:
    """A `+` layer's multi-latent attention (gpt/layer_spec.py): the whole causal context, always rotating (the
    flags that would give it a window or skip its rotary are refused: gpt/section_rules.py)."""
    return MLASelfAttention(config, plan, rng, config.output_init_std, rotary_cache=rotary_cache)
