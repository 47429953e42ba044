"""Causal self-attention, multi-head or grouped-query, as parts chosen once at build (as torchtitan's GQAttention): QKV
projection, q/k norms, rotary positions, kernel, output gate and dense projection."""

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

if TYPE_CHECKING:  # the model reads the masks' tensors without loading the data pipeline
    from data.documents import DocumentMasks
    from gpt.layer_spec import LayerSpec


class SelfAttention(nn.Module):
    """Causal attention with one fused QKV projection, multi-head or grouped-query. Parameters register in the order
    checkpoints name them: q/k norms, query_key_value, softmax_offset, dense."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 window: Optional[int] = None, rotary: bool = True, rotary_cache: Optional[RotaryCache] = None):
        """`window`: this layer's sliding window, or None; `rotary`: False on a --no-rope-freq layer; `rotary_cache`:
        cos and sin shared by the model's layers."""
        super().__init__()
        self.rng = rng  # this TP rank's stream for attention dropout
        self.layout = QKVLayout(config, plan.state)
        self.qk_treatment = QKTreatment(config)
        self.q_layernorm, self.k_layernorm = qk_norms(config, plan.state)
        self.query_key_value = self.layout.projection(plan, config)
        self.softmax_offset = softmax_offset(config, self.layout)
        self.dense = plan.linear("attention.dense", config.num_attention_heads * config.head_dim, config.hidden_size,
                                 init_std=config.output_init_std, bias=config.add_bias_linear)
        self.positions = layer_positions(config, plan.state, window, rotary, rotary_cache)
        self.kernel = AttentionKernel(config, plan.state, self.layout, window)

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`documents`: the block-diagonal causal mask where --reset-attention-mask set one; `cache`: `hidden` follows
        the cached tokens. Rotary positions stay 0..seq-1 under --reset-position-ids, as in Megatron-Core."""
        query, key, value, gate = self.layout.split(self.query_key_value(hidden))
        query, key, value = self.qk_treatment(self.q_layernorm, self.k_layernorm, query, key, value)
        query, key = self.positions.rotated(query, key, cache)
        context = self.kernel(query, key, value, documents, cache, self.rng, self.training, self.softmax_offset)
        return self.dense(output_gated(context, gate))


def output_gated(context: torch.Tensor, gate: Optional[torch.Tensor]) -> torch.Tensor:
    """--attention-output-gate: context x sigmoid(gate) in fp32, as Megatron-Core's _apply_output_gate."""
    if gate is None:
        return context
    return (context * torch.sigmoid(gate.float())).to(context.dtype)


def build_attention(config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                    spec: "LayerSpec", rotary_cache: Optional[RotaryCache]) -> SelfAttention:
    """A `*` layer's attention at its window and rotary."""
    return SelfAttention(config, plan, rng, window=spec.window, rotary=spec.rotary, rotary_cache=rotary_cache)
