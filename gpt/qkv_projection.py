"""The attention's fused QKV projection: heads and key/value groups per TP rank, the projection's rows laid out group by
group ([group][query heads, (gates,) k, v][head_dim], Megatron-Core's linear_qkv) so column-parallel slices hold whole
groups, and the split of its output."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from gpt.model_config import ModelConfig
from gpt.parallel_plan import TensorParallelPlan
from parallel.mappings import gather_last_dim_summing_backward
from parallel.state import ParallelState


class QKVLayout:
    """One attention layer's heads on this TP rank and the split of its QKV output."""

    def __init__(self, config: ModelConfig, state: ParallelState):
        tp, heads = state.tensor_parallel_size, config.num_attention_heads
        groups = config.attention.query_groups(heads)
        self.state, self.head_dim, self.groups = state, config.head_dim, groups
        self.heads_per_rank = heads // tp
        self.heads_per_group = heads // groups
        self.output_gate = config.attention.attention_output_gate
        # Fewer groups than TP ranks: a rank's contiguous rows are part of one group, so the output is all-gathered and
        # each rank reads its group and heads; the gather's backward gives the TP-1 gradient.
        self.kv_replicas = tp // groups if groups < tp else 1  # the TP ranks that read one group
        self.groups_per_rank = max(groups // tp, 1)
        # a group's query (and gate) heads
        self.query_heads = self.heads_per_group * (2 if self.output_gate else 1)
        self._heads = self._multi_head if self.query_heads == 1 else self._grouped

    @property
    def queries_per_key(self) -> int:
        return self.heads_per_rank // self.groups_per_rank

    def projection(self, plan: TensorParallelPlan, config: ModelConfig) -> nn.Module:
        """The column-parallel `attention.query_key_value`, its weight tagged with one group's row blocks (Muon
        orthogonalizes q, k and v apart)."""
        rows = (config.num_attention_heads * (2 if self.output_gate else 1) + 2 * self.groups) * self.head_dim
        linear = plan.linear("attention.query_key_value", config.hidden_size, rows, init_std=config.init_method_std,
                             bias=config.attention.qkv_bias(config.add_bias_linear))
        group_query = self.heads_per_group * self.head_dim
        linear.weight.qkv_split_shapes = \
            [group_query] * (2 if self.output_gate else 1) + [self.head_dim, self.head_dim]
        return linear

    def split(self, qkv: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The output [batch, seq, rows] as query [batch, heads, seq, d], key and value [batch, groups, seq, d], and the
        gate or None."""
        if self.kv_replicas > 1:  # every group's rows gathered, this rank's kept
            qkv = gather_last_dim_summing_backward(qkv, self.state)
            width = qkv.shape[-1] * self.kv_replicas // self.state.tensor_parallel_size
            qkv = qkv.narrow(-1, self.state.tensor_parallel_rank // self.kv_replicas * width, width)
        batch, seq, _ = qkv.shape
        return self._heads(qkv.view(batch, seq, self.groups_per_rank, self.query_heads + 2, self.head_dim))

    def _multi_head(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        query, key, value = qkv.permute(3, 0, 2, 1, 4).unbind(0)
        return query, key, value, None

    def _grouped(self, qkv: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        # one split of views, whose backward is one cat, as Megatron-Core's torch.split
        batch, seq = qkv.shape[:2]
        per_group = self.heads_per_group
        query, *gate, key, value = qkv.split([per_group] * (self.query_heads // per_group) + [1, 1], dim=3)
        if self.kv_replicas > 1:
            start = self.state.tensor_parallel_rank % self.kv_replicas * self.heads_per_rank
            query, *gate = (part.narrow(3, start, self.heads_per_rank) for part in (query, *gate))
        query = query.reshape(batch, seq, self.heads_per_rank, self.head_dim).transpose(1, 2)
        # head g * per_group + j's gate, in the context's head order
        gate = gate[0].reshape(batch, seq, self.heads_per_rank * self.head_dim) if gate else None
        key, value = (part.squeeze(3).transpose(1, 2) for part in (key, value))
        return query, key, value, gate
