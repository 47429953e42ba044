"""Causal self-attention, multi-head or grouped-query, as a sequence of parts each chosen once at build (as
torchtitan's GQAttention.Config builds its qkv_linear, qk_norm, rope and inner_attention): the fused QKV projection and
its split (gpt/qkv_projection.py), the q/k norms and clamp (gpt/qk_norm.py), the rotary positions
(gpt/rotary_positions.py), the attention kernel (gpt/attention_kernel.py), then the output gate and the dense
projection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from gpt.attention_kernel import AttentionKernel, softmax_offset
from gpt.kv_cache import LayerCache
from gpt.model_config import ModelConfig
from gpt.parallel_plan import TensorParallelPlan
from gpt.qk_norm import QKTreatment, qk_norms
from gpt.qkv_projection import QKVLayout
from gpt.rotary import RotaryCache
from gpt.rotary_positions import layer_positions
from parallel.random import TensorParallelRNG

if TYPE_CHECKING:  # the model reads the masks' tensors; importing it loads no data pipeline (tests/test_layering.py)
    from data.documents import DocumentMasks
    from gpt.layer_spec import LayerSpec


class SelfAttention(nn.Module):
    """Causal attention with one fused QKV projection; multi-head, or grouped-query (a key/value head per group of
    query heads; one group is multi-query). Its parameters are what checkpoints and the Hugging Face families name,
    registered in this order: q_layernorm, k_layernorm (--qk-layernorm), query_key_value, softmax_offset
    (--softmax-type learnable: named_parameters() lists it, the module's own, first) and dense; its other parts
    hold none."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 window: Optional[int] = None, rotary: bool = True, rotary_cache: Optional[RotaryCache] = None):
        """`window`: this layer's sliding window, the keys before each query it sees (gpt/attention_window.py), or
        None for the whole causal context; `rotary`: False on a --no-rope-freq layer; `rotary_cache`: the model's
        cos and sin, shared by its layers (gpt/rotary.py; None: this layer's own)."""
        super().__init__()
        self.rng = rng  # this TP rank's stream, from which its heads draw their attention dropout
        self.layout = QKVLayout(config, plan.state)
        self.qk_treatment = QKTreatment(config)
        self.q_layernorm, self.k_layernorm = qk_norms(config, plan.state)
        self.query_key_value = self.layout.projection(plan, config)
        self.softmax_offset = softmax_offset(config, self.layout)
        # heads x head width in, hidden out (Megatron-Core's linear_proj: query_projection_size -> hidden_size)
        self.dense = plan.linear("attention.dense", config.num_attention_heads * config.head_dim, config.hidden_size,
                                 init_std=config.output_init_std, bias=config.add_bias_linear)
        self.positions = layer_positions(config, plan.state, window, rotary, rotary_cache)
        self.kernel = AttentionKernel(config, plan.state, self.layout, window)

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`documents` (data/documents.py): a block-diagonal causal mask where --reset-attention-mask set one,
        else the causal mask; `cache` (gpt/kv_cache.py): `hidden` is the tokens after those the cache holds, whose
        keys and values they also see (generation, gpt/decode.py). Rotary positions stay 0..seq-1 under
        --reset-position-ids, as in Megatron-Core's GPTModel._preprocess (`self.rotary_pos_emb(rotary_seq_len, ...)`
        for 'rope': position_ids reach only the learned embedding and mrope) and Megatron-DeepSpeed's
        TransformerLanguageModel.forward (`self.rotary_pos_emb(self.seq_length)`); within a document the rotation
        of q.k depends only on the positions' difference, which a reset does not change."""
        # the whole sequence: under sequence parallelism the projection gathers it
        query, key, value, gate = self.layout.split(self.query_key_value(hidden))
        query, key, value = self.qk_treatment(self.q_layernorm, self.k_layernorm, query, key, value)
        query, key = self.positions.rotated(query, key, cache)
        context = self.kernel(query, key, value, documents, cache, self.rng, self.training, self.softmax_offset)
        return self.dense(output_gated(context, gate))


def output_gated(context: torch.Tensor, gate: Optional[torch.Tensor]) -> torch.Tensor:
    """--attention-output-gate: the context times sigmoid(gate), in fp32 and cast back (Megatron-Core's
    Attention._apply_output_gate), before the output projection; the context itself without a gate."""
    if gate is None:
        return context
    return (context * torch.sigmoid(gate.float())).to(context.dtype)


def build_attention(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                    spec: "LayerSpec", rotary_cache: Optional[RotaryCache]) -> SelfAttention:
    """A `*` layer's attention (gpt/layer_spec.py), at its window and rotary."""
    return SelfAttention(config, plan, rng, window=spec.window, rotary=spec.rotary, rotary_cache=rotary_cache)
