"""GPT-2: token + learned position embeddings, pre-LayerNorm blocks, final LayerNorm, tied logits; and
the Llama-shaped variants the config's sections select (gpt/norms.py, mlp.py, positions.py, attention_settings.py): RMSNorm, SwiGLU, rotary or no
positions, grouped-query attention, an untied output layer, linears without biases; and Megatron-LM's
squared ReLU, interleaved rotary and attention output gate.

Every linear and the token embedding come from `parallel.layers`, built through the declared tensor-parallel plan
(gpt/parallel_plan.py), so one model definition serves every TP size. Tensors are [batch, sequence, hidden]. With
a plan that splits the sequence (--sequence-parallel) everything outside the TP regions (embedding dropout, norms,
residual adds, dropout) holds this rank's slice of the sequence: column-parallel linears gather it, row-parallel
ones reduce-scatter it, the output layer gathers it before the vocab-parallel loss, as Megatron-Core's GPTModel
(parallel/mappings.py); dropout there draws from the rank's private stream, as Megatron-Core's TransformerBlock
under `get_cuda_rng_tracker().fork()`.

Initialisation follows GPT-2/Megatron: normal(0, 0.02) weights, zero biases, unit LayerNorm gains, and each
residual branch's output projection (attention `dense`, MLP `dense_4h_to_h`) scaled by 1/sqrt(2 * num_layers).
`GPTModel(...)` builds the structure on the meta device (no memory, no draws: milliseconds even at 170B); each
parameter carries its initialisation, a pure function of (seed, name, element index) (parallel/init.py). Memory
comes afterwards, only for what this rank owns: `zero.apply.apply_zero` fills ZeRO's flat buffers directly, and
`build_gpt_model` (tests, tools, one process) materializes the whole TP slice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from gpt.attention_backend import attention_kernels
from gpt.attention_padding import attention_at_head_dim, padded_head_dim
from gpt.attention_sinks import attention_with_sinks, sink_logits
from gpt.attention_softcap import softcapped_attention
from gpt.attention_window import causal_window_mask
from gpt.cp_attention import context_parallel_attention
from gpt.embedding import build_position_embedding, build_word_embedding, embed_tokens
from gpt.hybrid_pattern import ATTENTION, MLA, MOE
from gpt.hybrid_pattern import MLP as DENSE_MLP
from gpt.kv_cache import LayerCache
from gpt.layer_spec import LayerSpec, layer_specs
from gpt.mla import build_mla
from gpt.mlp import build_mlp
from gpt.model_config import ModelConfig
from gpt.moe.balancing import MoELossTracker
from gpt.moe.layer import build_moe_layer
from gpt.mtp import MTPLossTracker, MultiTokenPredictionLayer, attach_mtp_loss
from gpt.norms import HeadNorm, L2HeadNorm, ProjectionNorm
from gpt.output_head import build_output_layer, output_of, output_vocab_start
from gpt.parallel_plan import TensorParallelPlan
from gpt.rotary import RotaryCache, apply_rotary, rotary_angles, yarn_angles
from gpt.stage_layers import StageLayers, whole_model
from parallel.context_parallel import positions_on_this_rank
from parallel.init import InitMethod, materialize
from parallel.layers import meta_parameter
from parallel.mappings import (
    gather_last_dim_summing_backward,
)
from parallel.random import TensorParallelRNG, dropout_stream
from parallel.sharding import check_recorded
from parallel.state import ParallelState
from zero.gated_parameters import wait_at_region_entry

if TYPE_CHECKING:  # the model reads the masks' tensors; importing it loads no data pipeline (tests/test_layering.py)
    from data.documents import DocumentMasks


def sdpa_takes_grouped_kv(attention_backend: str) -> bool:
    """Whether SDPA reads each group's key/value head for its query heads itself (enable_gqa, in every torch
    this project pins: query head i reads key/value head i // (heads / groups), as repeat_interleave's copies
    do), so the copies of k and v per query head are never made. The memory-efficient and cuDNN kernels, all
    that --attention-backend fused allows, do not take enable_gqa in every torch version: that backend keeps
    the copies."""
    return attention_backend != "fused"


# The key of the multi-token prediction layers among a forward's parts (GPTModel.fp8_pass_starts); model chunks are
# keyed by their index on this pipeline rank
MTP_PASS = "mtp"


class SelfAttention(nn.Module):
    """Causal attention with one fused QKV projection; multi-head, or grouped-query (a key/value head per
    group of query heads; one group is multi-query).

    The QKV weight's output rows are laid out group by group, [group][its query heads, k, v][head_dim]
    (Megatron-Core's linear_qkv layout), so that contiguous column-parallel slices hand each TP rank whole
    groups. With a group per head this is GPT-2's [head][q, k, v][head_dim].

    With --attention-output-gate each group's rows also hold a gate head per query head, after them:
    [group][its query heads, their gate heads, k, v][head_dim], as Megatron-Core's linear_qkv
    (SelfAttention.__init__ adds kv_channels x heads rows; get_query_key_value_tensors splits each group
    into np/ng * hn, np/ng * hn, hn, hn). So the gate is column-parallel with the rest of QKV, and a TP
    rank holds the gates of its own heads. Attention's output is multiplied by sigmoid(gate), in fp32 and
    cast back (Attention._apply_output_gate), before the output projection.
    """

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 window: Optional[int] = None, rotary: bool = True, rotary_cache: Optional[RotaryCache] = None):
        """`window`: this layer's sliding window, the keys before each query it sees (gpt/attention_window.py), or
        None for the whole causal context; `rotary`: False on a --no-rope-freq layer; `rotary_cache`: the model's
        cos and sin, shared by its layers (gpt/rotary.py; None: this layer's own)."""
        super().__init__()
        self.rotary_cache = rotary_cache if rotary_cache is not None else RotaryCache()
        self.rng = rng
        self.window = window
        state = plan.state
        tp = state.tensor_parallel_size
        self.heads_per_rank = config.num_attention_heads // tp
        attention, positions = config.attention, config.positions
        groups = attention.query_groups(config.num_attention_heads)
        # Fewer key/value groups than TP ranks (Megatron-Core's attention.py:289): the QKV weight is still cut in
        # contiguous rows, so a rank's rows are part of one group's; its output is all-gathered, and each rank
        # reads its group (rank // replicas) and, of that group's query heads, its own heads_per_rank
        # (get_query_key_value_tensors). The gather's backward reduce-scatters: each slice's gradient is the sum
        # of what every rank read from it, the TP-1 gradient.
        self.kv_replicas = tp // groups if groups < tp else 1  # the TP ranks that read one group
        self.groups_per_rank = max(groups // tp, 1)
        self.heads_per_group = config.num_attention_heads // groups
        self.tp_state = state
        self.head_dim = config.head_dim
        self.dropout_p = config.attention.attention_dropout
        self.attention_backend = config.attention.attention_backend
        self.pad_head_dim = config.attention.pad_attention_head_dim
        self.native_gqa = self.groups_per_rank < self.heads_per_rank and sdpa_takes_grouped_kv(config.attention.attention_backend)
        # --no-rope-freq's layers skip the rotation (Megatron-Core's Attention.forward: `rotary_pos_emb = None`)
        self.rotary = positions.rotary and rotary
        self.positions = positions
        # --local-rotary-base: a sliding-window layer's own rotary, unscaled (Gemma 3's rope_parameters for its
        # "sliding_attention" layers); the other layers' base, Llama 3 scaling and interpolation
        local = window is not None and positions.local_rotary_base is not None
        self.rotary_base = positions.local_rotary_base if local else positions.rotary_base
        self.rope_scaling = None if local else positions.rope_scaling
        self.rotary_interpolation = None if local else positions.rotary_seq_len_interpolation_factor
        self.rotary_interleaved = positions.rotary_interleaved
        self.longrope = config.longrope  # --position-embedding-type longrope's resolved factors (gpt/longrope.py)
        # the scores' scale (None: 1/sqrt(head width)) and Gemma 2's soft-capping of them (gpt/attention_softcap.py)
        self.softmax_scale = attention.softmax_scale
        self.softcap = attention.attn_logit_softcapping
        self.clip_qkv = attention.clip_qkv
        # With context parallelism the sequence here is this rank's two chunks (parallel/context_parallel.py):
        # rotary angles at their global positions, attention over the whole sequence (gpt/cp_attention.py).
        self.context_parallel = state if state.context_parallel_size > 1 else None
        self.cp_comm_type = config.attention.cp_comm_type
        self.norm_over_projection = attention.qk_layernorm and attention.qk_layernorm_over_projection
        kind, eps, zero_centered = config.norms.normalization, config.norms.layernorm_epsilon, config.norms.apply_layernorm_1p
        if attention.qk_l2_norm:  # before --qk-layernorm, as Megatron-Core's SelfAttention picks its norm class
            self.q_layernorm = self.k_layernorm = L2HeadNorm(eps)
        elif self.norm_over_projection:  # OLMo 2's: over all heads' features (their TP slices: gpt/norms.py)
            groups = attention.query_groups(config.num_attention_heads)
            self.q_layernorm = ProjectionNorm(kind, config.num_attention_heads * config.head_dim, eps, state,
                                              zero_centered)
            self.k_layernorm = ProjectionNorm(kind, groups * config.head_dim, eps, state, zero_centered)
        elif attention.qk_layernorm:
            self.q_layernorm = HeadNorm(kind, config.head_dim, eps, state, zero_centered)
            self.k_layernorm = HeadNorm(kind, config.head_dim, eps, state, zero_centered)
        else:
            self.q_layernorm = self.k_layernorm = None
        self.rotary_dim = positions.rotary_dim(config.head_dim)
        h = config.hidden_size
        self.output_gate = attention.attention_output_gate
        query_rows = config.num_attention_heads * (2 if self.output_gate else 1)  # a gate head per query head
        qkv_rows = (query_rows + 2 * groups) * config.head_dim
        self.query_key_value = plan.linear("attention.query_key_value", h, qkv_rows,
                                           init_std=config.init_method_std,
                                           bias=attention.qkv_bias(config.add_bias_linear))
        # One query group's rows, block by block (Megatron-Core's _get_qkv_split_shapes): --optimizer muon
        # orthogonalizes the query (and gate), key and value blocks apart (zero/muon.py).
        group_query = self.heads_per_group * config.head_dim
        self.query_key_value.weight.qkv_split_shapes = \
            [group_query] * (2 if self.output_gate else 1) + [config.head_dim, config.head_dim]
        # --softmax-type (gpt/attention_sinks.py): Megatron-Core's DotProductAttention.softmax_offset, a parameter of
        # this rank's heads (split with them, drawn as Megatron's init_method draws it) for learnable, zeros for
        # off-by-one
        self.softmax_type = attention.softmax_type
        if self.softmax_type == "learnable":
            self.softmax_offset = meta_parameter((self.heads_per_rank,), InitMethod.normal(config.init_method_std),
                                                 state, split_dim=0)
        else:
            self.softmax_offset = None
        # heads x head width in, hidden out (Megatron-Core's linear_proj: query_projection_size -> hidden_size)
        self.dense = plan.linear("attention.dense", config.num_attention_heads * config.head_dim, h,
                                 init_std=_output_layer_std(config), bias=config.add_bias_linear)

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`documents` (data/documents.py): a block-diagonal causal mask where --reset-attention-mask set one,
        else the causal mask; `cache` (gpt/kv_cache.py): `hidden` is the tokens after those the cache holds, whose
        keys and values they also see (generation, gpt/decode.py). Rotary positions stay 0..seq-1 under --reset-position-ids, as in Megatron-Core's
        GPTModel._preprocess (`self.rotary_pos_emb(rotary_seq_len, ...)` for 'rope': position_ids reach only the
        learned embedding and mrope) and Megatron-DeepSpeed's TransformerLanguageModel.forward
        (`self.rotary_pos_emb(self.seq_length)`); within a document the rotation of q.k depends only on the
        positions' difference, which a reset does not change."""
        # each [batch, heads, seq, head_dim]; key and value with one head per group under native_gqa; the
        # gate [batch, seq, heads x head_dim] or None
        attention_mask = documents.attention_mask if documents is not None else None
        query, key, value, gate = self._query_key_value(hidden, cache)
        batch, _, seq, _ = query.shape  # the whole sequence, also when `hidden` is a slice of it
        if cache is not None:  # the new tokens' queries over the cached keys: causal and windowed by position
            attention_mask = cache.visible(seq, self.window, query.device)
        elif self.window is not None and self.context_parallel is None:
            # the sliding window, over the documents' mask where there is one (CP's attention windows by itself)
            attention_mask = causal_window_mask(seq, self.window, query.device, attention_mask)
        # Each TP rank holds different heads: their dropout masks come from the rank's own stream.
        # The device is known only here (the model is built on meta): whether to pad is decided per call.
        head_dim = padded_head_dim(self.head_dim, query.device.type, self.attention_backend, self.pad_head_dim)
        dropout_p = self.dropout_p if self.training else 0.0
        sinks = None if self.softmax_type == "vanilla" else sink_logits(self.softmax_offset, self.heads_per_rank,
                                                                        query)
        with dropout_stream(self.rng), attention_kernels(self.attention_backend):
            if self.context_parallel is not None:  # --reset-attention-mask's documents by their ids
                document_ids = documents.document_ids if documents is not None else None
                context = context_parallel_attention(query, key, value, self.context_parallel, self.cp_comm_type,
                                                     dropout_p, enable_gqa=self.native_gqa, window=self.window,
                                                     scale=self.softmax_scale, softcap=self.softcap, sinks=sinks,
                                                     document_ids=document_ids)
            elif sinks is not None:  # (with soft-capping refused: gpt/model_config.py)
                context = attention_with_sinks(query, key, value, sinks, dropout_p, enable_gqa=self.native_gqa,
                                               attention_mask=attention_mask, scale=self.softmax_scale)
            else:
                if self.softcap is not None:  # scores SDPA cannot cap: computed explicitly
                    context = softcapped_attention(query, key, value, self.softcap, self.softmax_scale, attention_mask,
                                                   dropout_p)
                else:
                    context = attention_at_head_dim(query, key, value, head_dim, dropout_p=dropout_p,
                                                    enable_gqa=self.native_gqa, attention_mask=attention_mask,
                                                    scale=self.softmax_scale)
        context = context.transpose(1, 2).reshape(batch, seq, self.heads_per_rank * self.head_dim)
        if gate is not None:
            context = (context * torch.sigmoid(gate.float())).to(context.dtype)
        return self.dense(context)

    def _query_key_value(self, hidden: torch.Tensor, cache: Optional[LayerCache] = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        qkv = self.query_key_value(hidden)  # the whole sequence: under sequence parallelism, gathered
        if self.kv_replicas > 1:  # every group's rows gathered, this rank's group kept (see __init__)
            qkv = gather_last_dim_summing_backward(qkv, self.tp_state)
            width = qkv.shape[-1] * self.kv_replicas // self.tp_state.tensor_parallel_size
            qkv = qkv.narrow(-1, self.tp_state.tensor_parallel_rank // self.kv_replicas * width, width)
        batch, seq, _ = qkv.shape
        per_group = self.heads_per_group
        query_heads = 2 * per_group if self.output_gate else per_group  # a group's query (and gate) heads
        qkv = qkv.view(batch, seq, self.groups_per_rank, query_heads + 2, self.head_dim)
        gate = None
        if per_group == 1 and not self.output_gate:  # multi-head: GPT-2's exact operations
            query, key, value = qkv.permute(3, 0, 2, 1, 4).unbind(0)
        else:
            # one split (views; its backward one cat, as Megatron-Core's get_query_key_value_tensors' torch.split),
            # where slicing and selecting each part made a zero-filled gradient of the whole per part to sum
            gated = [per_group] if self.output_gate else []
            query, *gate_part, key, value = qkv.split([per_group, *gated, 1, 1], dim=3)
            if self.kv_replicas > 1:  # of the group's query (and gate) heads, this rank's
                start = self.tp_state.tensor_parallel_rank % self.kv_replicas * self.heads_per_rank
                query, *gate_part = (part.narrow(3, start, self.heads_per_rank) for part in (query, *gate_part))
                per_group = self.heads_per_rank
            query = query.reshape(batch, seq, self.heads_per_rank, self.head_dim).transpose(1, 2)
            if gate_part:  # head g * per_group + j's gate, in the order the context's heads have
                gate = gate_part[0].reshape(batch, seq, self.heads_per_rank * self.head_dim)
            key, value = (part.squeeze(3).transpose(1, 2) for part in (key, value))
        if self.norm_over_projection:  # each [batch, heads, seq, d] as [batch, seq, heads x d], in head order
            query, key = (_heads_as_features(norm, heads)
                          for norm, heads in ((self.q_layernorm, query), (self.k_layernorm, key)))
        elif self.q_layernorm is not None:  # before rotary, as Megatron-Core's get_query_key_value_tensors
            query, key = self.q_layernorm(query), self.k_layernorm(key)
        if self.clip_qkv is not None:  # after the norms, as transformers' OlmoeAttention clamps
            query, key, value = (part.clamp(-self.clip_qkv, self.clip_qkv) for part in (query, key, value))
        if self.rotary:
            # in the queries' dtype, so that apply_rotary's own cast is a no-op; one pair for every layer (and for
            # q and k), so the products' backward keeps one copy
            cos, sin = self._cos_sin(seq, hidden.device, query.dtype, cache)
            query = apply_rotary(query, cos, sin, self.rotary_interleaved)
            key = apply_rotary(key, cos, sin, self.rotary_interleaved)
        repeated = per_group > 1 and not self.native_gqa
        if not repeated and _only_view_left(value, query, key):
            # q and k left the projection's output through their own ops (rotary, norms): attention would keep that
            # output whole for the value, a view of it; the value's own copy keeps its heads only, as Megatron-Core
            # keeps its value
            value = value.contiguous()
        if cache is not None:  # stored before the copies per query head: one head per group
            key, value = cache.extend(key, value)
        if repeated:
            # Query head i reads group i // per_group (transformers' repeat_kv, Megatron-Core's GQA).
            key, value = key.repeat_interleave(per_group, dim=1), value.repeat_interleave(per_group, dim=1)
        return query, key, value, gate


    def _cos_sin(self, seq: int, device: torch.device, dtype: torch.dtype, cache: Optional[LayerCache]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the `seq` tokens: positions 0..seq-1, or with a KV cache the new tokens' positions, cut from
        the angles of the cache's every position (the same values: each position's angle is its own product).
        LongRoPE picks its factors by the whole sequence's length, so its angles are made for the length so far, as
        transformers' dynamic LongRoPE picks them by the largest position."""
        if cache is None:
            return self.rotary_cache.angles(self._rotary_key(seq, device), dtype,
                                            lambda: self._angles_on_this_rank(seq, device))
        end = cache.start + seq
        if self.longrope is not None:
            cos, sin = (part.to(dtype) for part in self._rotary_angles(end, device))
        else:
            cos, sin = self.rotary_cache.angles(self._rotary_key(cache.capacity, device), dtype,
                                                lambda: self._rotary_angles(cache.capacity, device))
        return cos[cache.start:end], sin[cache.start:end]

    def _rotary_key(self, seq: int, device: torch.device) -> tuple:
        """What decides this layer's cos and sin besides their dtype (RotaryCache's key): its settings, the length
        and, with context parallelism, this rank's place in the sequence, and the device. (YaRN's settings are the
        model's, the same for every layer that shares the cache.)"""
        cp = self.context_parallel
        return ("rope", self.rotary_dim, self.head_dim, self.rotary_base, self.rope_scaling, self.rotary_interleaved,
                self.rotary_interpolation, id(self.longrope) if self.longrope is not None else None,
                self.positions.position_embedding_type, seq, str(device),
                None if cp is None else (cp.context_parallel_size, cp.context_parallel_rank))

    def _angles_on_this_rank(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of this rank's `seq` tokens: with context parallelism, each token's at its global position."""
        positions = positions_on_this_rank(seq, self.context_parallel, device) \
            if self.context_parallel is not None else None
        whole = seq if positions is None else seq * self.context_parallel.context_parallel_size
        cos, sin = self._rotary_angles(whole, device)
        return (cos, sin) if positions is None else (cos[positions], sin[positions])

    def _rotary_angles(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions 0..length-1: rope's (gpt/rotary.py rotary_angles), YaRN's (yarn_angles) or
        LongRoPE's (gpt/longrope.py: its short or long factors by the whole sequence's length, as transformers picks
        them by the largest position + 1)."""
        positions = self.positions
        if self.longrope is not None:
            return self.longrope.angles(length, self.rotary_dim, self.rotary_base, device)
        if positions.position_embedding_type == "yarn":
            return yarn_angles(length, self.head_dim, self.rotary_base, device, positions.rotary_scaling_factor,
                               positions.yarn_original_max_position_embeddings, positions.yarn_beta_fast,
                               positions.yarn_beta_slow, positions.yarn_correction_range_round_to_int,
                               positions.mscale, positions.mscale_all_dim)
        return rotary_angles(length, self.rotary_dim, self.rotary_base, device, self.rope_scaling,
                             self.rotary_interleaved, self.rotary_interpolation)


def build_attention(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                    spec: LayerSpec, rotary_cache: Optional[RotaryCache]) -> SelfAttention:
    """A `*` layer's attention (gpt/layer_spec.py), at its window and rotary."""
    return SelfAttention(config, plan, rng, window=spec.window, rotary=spec.rotary, rotary_cache=rotary_cache)


# Each part's builder by its symbol (gpt/layer_spec.py): a layer kind is its module, its builder and one entry here
MIXERS = {ATTENTION: build_attention, MLA: build_mla}
MLPS = {DENSE_MLP: build_mlp, MOE: build_moe_layer}


def _heads_as_features(norm: nn.Module, heads: torch.Tensor) -> torch.Tensor:
    """`norm` applied to [batch, heads, seq, d] as the projection's [batch, seq, heads x d] features."""
    batch, count, seq, dim = heads.shape
    features = norm(heads.transpose(1, 2).reshape(batch, seq, count * dim))
    return features.view(batch, seq, count, dim).transpose(1, 2)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm residual block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x))).

    The residual stream is identical on every TP rank, so its dropout uses the shared stream; under
    sequence parallelism each rank holds its own slice of it, and the dropout draws from the rank's
    private stream."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 layer_number: int = 0, moe_tracker: Optional[MoELossTracker] = None,
                 spec: Optional[LayerSpec] = None, rotary_cache: Optional[RotaryCache] = None):
        """`spec`: this block's parts (gpt/layer_spec.py), by default decoder layer `layer_number`'s (an MTP layer's
        block is given the last decoder layer's, gpt/mtp.py); `rotary_cache`: the model's cos and sin, shared by its
        layers (gpt/rotary.py)."""
        super().__init__()
        spec = spec or layer_specs(config)[layer_number]
        h, norms = config.hidden_size, config.norms

        # --recompute-modules layernorm: the input and pre-MLP norms (Megatron-Core's recompute_input_layernorm and
        # recompute_pre_mlp_layernorm, transformer_layer.py) keep only their input and run again in backward
        recomputed_norms = ("input_layernorm", "post_attention_layernorm") \
            if "layernorm" in config.recompute.modules else ()

        # --sublayer-norms: the norms on each sublayer's input (GPT-2, Llama), on its output inside the residual
        # branch (OLMo 2: transformers' Olmo2DecoderLayer, residual + norm(attn(x))), or both (Gemma 2/3)
        def norm(place: str, region: str) -> Optional[nn.Module]:
            return norms.build_sublayer(place, h, plan.norm_state(region), recompute=region in recomputed_norms)

        self.input_layernorm = norm("input", "input_layernorm")
        # the spec's mixer: attention at its window and rotary, or multi-latent attention (gpt/mla.py)
        self.attention = MIXERS[spec.mixer](config, plan, rng, spec, rotary_cache)
        self.post_attention_layernorm = norm("input", "post_attention_layernorm")
        self.split_dropout_rng = plan.dropout_rng("hidden_dropout", rng)
        # the spec's MLP: dense or gated (gpt/mlp.py), or an MoE layer (gpt/moe/layer.py) with its experts and, under
        # expert parallelism, the plan's dispatcher
        self.mlp = MLPS[spec.mlp](config, plan, spec, layer_number, moe_tracker)
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)
        # registered after the rest, so that a model without them keeps its parameters' order
        self.attention_output_layernorm = norm("output", "attention_output_layernorm")
        self.mlp_output_layernorm = norm("output", "mlp_output_layernorm")

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`cache`: this layer's KV cache, where `hidden` is the tokens after those it holds (gpt/decode.py)."""
        return self.mlp_half(self.attention_half(hidden, documents, cache))

    # The block's two halves, each with its norms, dropout and residual add: Megatron-Core's
    # TransformerLayer._forward_attention and _forward_mlp, the regions --cuda-graph-modules attn and mlp capture
    # (training/cuda_graphs.py).
    def attention_half(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                       cache: Optional[LayerCache] = None) -> torch.Tensor:
        branch = self.attention(_normed(self.input_layernorm, hidden), documents, cache)
        return hidden + self._residual_dropout(_normed(self.attention_output_layernorm, branch))

    def mlp_half(self, hidden: torch.Tensor) -> torch.Tensor:
        branch = self.mlp(_normed(self.post_attention_layernorm, hidden))
        return hidden + self._residual_dropout(_normed(self.mlp_output_layernorm, branch))

    def _residual_dropout(self, branch: torch.Tensor) -> torch.Tensor:
        with dropout_stream(self.split_dropout_rng):
            return self.hidden_dropout(branch)


def _normed(norm: Optional[nn.Module], hidden: torch.Tensor) -> torch.Tensor:
    """`norm(hidden)`, or `hidden` where --sublayer-norms puts no norm there."""
    return hidden if norm is None else norm(hidden)


class GPTModel(nn.Module):
    """Built on the meta device (see the module docstring), each layer's parts from its LayerSpec. `rng`: the per-TP
    rank dropout streams; without it (TP=1 tools, tests) dropout draws from torch's default generator.

    `plan` (gpt/parallel_plan.py) is how the layers split over `state`'s tensor-parallel group and whether the
    sequence is split; by default, no sequence parallelism (training/build.py's `parallelize` passes the run's).

    `stage` (gpt/stage_layers.py) builds one pipeline stage: its layers under their global names, the
    embedding on the first stage, the final norm and output layer on the last (which also holds the tied
    word embedding, whose gradient the embedding group sums); `chunk_forward` runs one of its model chunks.
    """

    def __init__(self, config: ModelConfig, state: ParallelState, rng: Optional[TensorParallelRNG] = None,
                 stage: Optional[StageLayers] = None, plan: Optional[TensorParallelPlan] = None):
        super().__init__()
        if config.vocab_size < 1:
            raise ValueError("ModelConfig.vocab_size is unset: fill it in from the tokenizer first")
        config.validate_blocks(state.tensor_parallel_size)
        self.config = config
        self.state = state
        self.stage = stage = stage or whole_model(config.num_layers)
        self.plan = plan = plan or TensorParallelPlan(state)
        if plan.state is not state:
            raise ValueError("the tensor-parallel plan is for another ParallelState than the model's")
        self.sequence_parallel = plan.sequence_parallel
        self.split_dropout_rng = plan.dropout_rng("embedding_dropout", rng)
        # Whether the word embedding is also the output layer (an untied first stage's output_layer is None too), and
        # whether a first and a last pipeline stage each hold a copy whose gradients the embedding group sums: tied,
        # or the last stage's MTP layers embed the rolled tokens (Megatron-Core builds its embedding where
        # `pre_process or mtp_process` and ties the copies: tie_word_embeddings_state_dict)
        self.tied_output = not config.output.untie_embeddings_and_output_weights
        self.shares_word_embedding = self.tied_output or config.mtp.num_layers > 0
        self.word_embeddings = build_word_embedding(config, plan, stage, self.shares_word_embedding)
        self.position_embeddings = build_position_embedding(config, stage)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        # Named by their global layer number ("blocks.5." on any stage), so their weights are drawn as the
        # one-stage model's; iteration follows the stage's chunks in order.
        self.blocks = nn.ModuleList()
        # The MoE layers' balancing-loss scale and logged values (gpt/moe/balancing.py); None for a dense model
        self.moe_tracker = MoELossTracker() if config.moe is not None else None
        # cos and sin made once and read by every layer (gpt/rotary.py): a plain object, no module state
        self.rotary_cache = RotaryCache()
        specs = layer_specs(config)  # each layer's parts, from the GPT flags or the hybrid pattern
        for layer in stage.layer_ids:
            self.blocks.add_module(str(layer), TransformerBlock(config, plan, rng, layer, self.moe_tracker,
                                                                spec=specs[layer], rotary_cache=self.rotary_cache))
        by_layer = dict(zip(stage.layer_ids, self.blocks))
        self.chunk_blocks = [nn.ModuleList(by_layer[layer] for layer in chunk) for chunk in stage.chunks]
        self.final_layernorm = config.norms.build(config.hidden_size, plan.norm_state("final_layernorm")) \
            if stage.last else None
        self.output_layer = build_output_layer(config, plan, stage)
        self.output_vocab_start = output_vocab_start(config, state)
        # Megatron-Core's MTP block (gpt/mtp.py) on the last stage: --mtp-num-layers layers, each with one block of
        # the last decoder layer's kind, numbered after the decoder's (num_layers + k, as get_mtp_layer_offset)
        self.mtp_layers = nn.ModuleList()
        self.mtp_tracker = MTPLossTracker(config.mtp.num_layers) if config.mtp.num_layers and stage.last else None
        if self.mtp_tracker is not None:
            for k in range(config.mtp.num_layers):
                block = TransformerBlock(config, plan, rng, config.num_layers + k, self.moe_tracker,
                                         spec=specs[-1], rotary_cache=self.rotary_cache)
                self.mtp_layers.append(MultiTokenPredictionLayer(block, config, plan))
        # How the blocks run: in a plain loop, or under activation checkpointing once
        # zero.activations.apply_activation_checkpointing has replaced it.
        self.run_blocks = run_in_order
        # FP8 delayed scaling's once-a-pass amax reduction and scale update (parallel/fp8/delayed_updates.py, set by
        # gpt/fp8.py's delayed_scaling_passes), keyed by model chunk and MTP_PASS; None without delayed scaling
        self.fp8_passes = None
        # Every parameter must say where it lives (parallel/sharding.py): read as whole by default, GPT-OSS's split
        # attention sinks once loaded whole into a TP half.
        check_recorded(self)

    def embed(self, tokens: torch.Tensor, documents: Optional[DocumentMasks] = None,
              positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The first block's input, [batch, seq, hidden] (under sequence parallelism, this rank's slice of the
        sequence: [batch, seq / TP, hidden]). Learned positions are 0..seq-1, or `documents.position_ids`
        [batch, seq] where given (--reset-position-ids), or `positions` (an MTP layer's, rolled: gpt/mtp.py)."""
        return embed_tokens(self, tokens, documents, positions)

    def hidden_states(self, tokens: torch.Tensor, documents: Optional[DocumentMasks] = None,
                      fp8_parts: tuple = (0,)) -> torch.Tensor:
        """The final norm's output, [batch, seq, hidden] (a slice of the sequence under sequence parallelism).
        `fp8_parts`: the parts of the model this forward runs (its one chunk, and MTP_PASS where the MTP layers
        run after it), for delayed scaling's once-a-pass update."""
        hidden = self.fp8_pass_starts(self.embed(tokens, documents), fp8_parts)
        hidden = self.run_blocks(self.blocks, hidden) if documents is None else \
            self.run_blocks(self.blocks, hidden, documents)
        return self.final_layernorm(hidden)

    def fp8_pass_starts(self, hidden: torch.Tensor, parts: tuple) -> torch.Tensor:
        """`hidden` enters the FP8 layers of `parts` (model chunks, MTP_PASS): under delayed scaling their
        output-gradient scales move once the backward through them is complete."""
        return hidden if self.fp8_passes is None else self.fp8_passes.mark_backward(hidden, parts)

    def fp8_pass_ends(self, parts: tuple) -> None:
        """The forward through the FP8 layers of `parts` is complete: under delayed scaling their input and weight
        scales move (once a pass, as TransformerEngine's autocast exit)."""
        if self.fp8_passes is not None:
            self.fp8_passes.forward_done(parts)

    def chunk_forward(self, chunk: int, inputs: torch.Tensor, labels: torch.Tensor | None = None,
                      documents: Optional[DocumentMasks] = None, tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Model chunk `chunk` of this pipeline stage: from tokens on the model's first chunk, else from
        the previous chunk's hidden states; to the per-token loss (or logits) on its last chunk, else to
        hidden states [batch, seq, hidden]. `documents`: the micro-batch's positions (read by the learned position
        embedding) and attention mask (every chunk's attention), where the document-masking flags are set.
        `tokens`: the micro-batch's tokens, which the last chunk's MTP layers embed (gpt/mtp.py)."""
        hidden = self.embed(inputs, documents) if self.stage.first and chunk == 0 else inputs
        ends_model = self.stage.last and chunk == len(self.stage.chunks) - 1
        mtp = ends_model and self.mtp_tracker is not None and labels is not None and self.training
        parts = (chunk, MTP_PASS) if mtp else (chunk,)
        hidden = self.fp8_pass_starts(hidden, parts)
        hidden = self.run_blocks(self.chunk_blocks[chunk], hidden) if documents is None else \
            self.run_blocks(self.chunk_blocks[chunk], hidden, documents)
        if ends_model:
            final_hidden = self.final_layernorm(hidden)
            if mtp:
                # the MTP layers on the last stage (Megatron-Core's default placement) read the micro-batch's tokens
                if tokens is None:
                    raise ValueError("the last stage's MTP layers need the micro-batch's tokens")
                final_hidden = attach_mtp_loss(self, final_hidden, tokens, labels, documents)
            self.fp8_pass_ends(parts)
            return self.output(final_hidden, labels)
        self.fp8_pass_ends(parts)
        return hidden

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None,
                documents: Optional[DocumentMasks] = None) -> torch.Tensor:
        """Logits [batch, seq, vocab] without labels; per-token cross-entropy [batch, seq] with them.

        The output layer (tied to the token embedding, or untied and split the same way) gives
        vocab-parallel logits: each TP rank scores its slice of the vocabulary and the loss is computed
        without gathering them. Padding rows of the vocabulary never take part in the softmax, so
        padding changes nothing. `documents` (data/documents.py): per-document positions and attention
        (--reset-position-ids, --reset-attention-mask); the loss mask is the caller's (masked_token_mean).
        """
        mtp = self.mtp_tracker is not None and labels is not None and self.training
        parts = (0, MTP_PASS) if mtp else (0,)
        final_hidden = self.hidden_states(tokens, documents, parts)
        if mtp:
            # the MTP losses ride on the hidden states' backward (gpt/mtp.py); the returned loss is the LM's alone
            final_hidden = attach_mtp_loss(self, final_hidden, tokens, labels, documents)
        self.fp8_pass_ends(parts)
        return self.output(final_hidden, labels)

    def output(self, final_hidden: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """The output layer (and the loss, with labels) on the final norm's output (gpt/output_head.py)."""
        return output_of(self, final_hidden, labels)


def _only_view_left(value: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether `value` is a view that none of `others` shares its storage with (outside torch.compile, whose graph
    keeps what it chooses)."""
    if torch.compiler.is_compiling() or value._base is None:
        return False
    return not any(torch._C._is_alias_of(value, other) for other in others)


def compile_blocks(model: GPTModel, options: Optional[dict] = None) -> None:
    """torch.compile each transformer block in place (nn.Module.compile: names, parameters and hooks
    stay as they are). Call it after parallelism is applied. What must stay eager is marked so where
    it is defined: the communicator's collectives (byte accounting) and ZeRO stage 3's gather hooks
    (Python bookkeeping that would otherwise be traced and recompiled every step). With
    --overlap-param-gather a block waits for its parameters' gathers as it is entered
    (zero/gated_parameters.py), so the compiled forward never sees a gather in flight. `options`: inductor's
    (gpt/fp8.py compile_options), None for its defaults."""
    for block in model.blocks:
        wait_at_region_entry(block)
        block.compile(options=options)


def run_in_order(blocks: nn.ModuleList, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None
                 ) -> torch.Tensor:
    for block in blocks:
        hidden = block(hidden) if documents is None else block(hidden, documents)
    return hidden


def build_gpt_model(config: ModelConfig, state: ParallelState, seed: int, rng: Optional[TensorParallelRNG] = None,
                    dtype: torch.dtype = torch.float32, plan: Optional[TensorParallelPlan] = None) -> GPTModel:
    """A GPTModel with this TP rank's whole slice materialized on `state.device` (tests, tools and
    single-process use; training materializes through ZeRO, which holds only what each rank owns)."""
    return materialize(GPTModel(config, state, rng, plan=plan), seed, device=state.device, dtype=dtype)


def _output_layer_std(config: ModelConfig) -> float:
    return config.output_init_std
