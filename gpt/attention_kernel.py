"""The attention kernel of one layer, chosen once at build from its settings: the context-parallel exchange, attention
sinks, soft-capped scores or SDPA, with the layer's mask (causal, documents, KV cache, sliding window), dropout on this
TP rank's stream, and grouped keys and values read natively or copied per query head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from gpt.attention_backend import attention_kernels
from gpt.attention_padding import attention_at_head_dim, padded_head_dim
from gpt.attention_sinks import attention_with_sinks, sink_logits
from gpt.attention_softcap import softcapped_attention
from gpt.attention_window import causal_window_mask
from gpt.cp_attention import context_parallel_attention
from gpt.kv_cache import LayerCache
from gpt.model_config import ModelConfig
from gpt.qkv_projection import QKVLayout
from parallel.init import InitMethod
from parallel.layers import meta_parameter
from parallel.random import TensorParallelRNG, dropout_stream
from parallel.state import ParallelState

if TYPE_CHECKING:  # the kernel reads the masks' tensors without loading the data pipeline
    from data.documents import DocumentMasks


def sdpa_takes_grouped_kv(attention_backend: str) -> bool:
    """Whether SDPA reads grouped key/value heads itself (enable_gqa), so no per-query-head copies are made; the fused
    backend keeps the copies, as not every torch takes enable_gqa there."""
    return attention_backend != "fused"


def softmax_offset(config: ModelConfig, layout: QKVLayout) -> Optional[torch.nn.Parameter]:
    """--softmax-type learnable's offsets: a parameter of this rank's heads, drawn as Megatron's init_method; None
    otherwise."""
    if config.attention.softmax_type != "learnable":
        return None
    return meta_parameter((layout.heads_per_rank,), InitMethod.normal(config.init_method_std), layout.state,
                          split_dim=0)


class AttentionKernel:
    """Queries, keys and values [batch, heads (or groups), seq, head_dim] -> context [batch, seq, heads x head_dim]."""

    def __init__(self, config: ModelConfig, state: ParallelState, layout: QKVLayout, window: Optional[int]):
        attention = config.attention
        self.window, self.head_dim, self.heads = window, config.head_dim, layout.heads_per_rank
        self.attention_backend, self.pad_head_dim = attention.attention_backend, attention.pad_attention_head_dim
        self.dropout_p, self.scale, self.softcap = (attention.attention_dropout, attention.softmax_scale,
                                                    attention.attn_logit_softcapping)
        self.queries_per_key = layout.queries_per_key
        self.native_gqa = self.queries_per_key > 1 and sdpa_takes_grouped_kv(attention.attention_backend)
        self.sinks = attention.softmax_type != "vanilla"
        self.context_parallel = state if state.context_parallel_size > 1 else None
        self.cp_comm_type = attention.cp_comm_type
        self._attend = self._context_parallel if self.context_parallel is not None else self._with_sinks \
            if self.sinks else self._softcapped if self.softcap is not None else self._sdpa

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 documents: Optional[DocumentMasks], cache: Optional[LayerCache], rng: Optional[TensorParallelRNG],
                 training: bool, offset: Optional[torch.Tensor]) -> torch.Tensor:
        """`cache`: keys and values of earlier tokens, which these also see; `rng`: this TP rank's dropout stream;
        `offset`: learned sink logits."""
        key, value = self._keys_and_values(query, key, value, cache)
        batch, _, seq, _ = query.shape  # the whole sequence, also when the block's input is a slice
        visible = self._visible(seq, query.device, documents, cache)
        dropout_p = self.dropout_p if training else 0.0
        sinks = sink_logits(offset, self.heads, query) if self.sinks else None
        with dropout_stream(rng), attention_kernels(self.attention_backend):
            context = self._attend(query, key, value, visible, documents, dropout_p, sinks)
        return context.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim)

    def _keys_and_values(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         cache: Optional[LayerCache]) -> tuple[torch.Tensor, torch.Tensor]:
        repeated = self.queries_per_key > 1 and not self.native_gqa
        if not repeated and _only_view_left(value, query, key):
            # the value's own copy keeps only its heads, as Megatron-Core keeps its value, instead of the whole
            # projection output it views
            value = value.contiguous()
        if cache is not None:  # stored before the per-query-head copies: one head per group
            key, value = cache.extend(key, value)
        if repeated:  # query head i reads group i // per_group (transformers' repeat_kv)
            copies = self.queries_per_key
            key, value = key.repeat_interleave(copies, dim=1), value.repeat_interleave(copies, dim=1)
        return key, value

    def _visible(self, seq: int, device: torch.device, documents: Optional[DocumentMasks],
                 cache: Optional[LayerCache]) -> Optional[torch.Tensor]:
        """The bool mask of keys each query sees, or None for plain causal attention."""
        if cache is not None:
            return cache.visible(seq, self.window, device)
        mask = documents.attention_mask if documents is not None else None
        if self.window is not None and self.context_parallel is None:
            return causal_window_mask(seq, self.window, device, mask)
        return mask

    def _context_parallel(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          visible: Optional[torch.Tensor], documents: Optional[DocumentMasks], dropout_p: float,
                          sinks: Optional[torch.Tensor]) -> torch.Tensor:
        document_ids = documents.document_ids if documents is not None else None
        return context_parallel_attention(query, key, value, self.context_parallel, self.cp_comm_type, dropout_p,
                                          enable_gqa=self.native_gqa, window=self.window, scale=self.scale,
                                          softcap=self.softcap, sinks=sinks, document_ids=document_ids)

    def _with_sinks(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    visible: Optional[torch.Tensor], documents: Optional[DocumentMasks], dropout_p: float,
                    sinks: torch.Tensor) -> torch.Tensor:
        return attention_with_sinks(query, key, value, sinks, dropout_p, enable_gqa=self.native_gqa,
                                    attention_mask=visible, scale=self.scale)

    def _softcapped(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    visible: Optional[torch.Tensor], documents: Optional[DocumentMasks], dropout_p: float,
                    sinks: None) -> torch.Tensor:
        # scores SDPA cannot cap: computed explicitly
        return softcapped_attention(query, key, value, self.softcap, self.scale, visible, dropout_p)

    def _sdpa(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: Optional[torch.Tensor],
              documents: Optional[DocumentMasks], dropout_p: float, sinks: None) -> torch.Tensor:
        # the device is known only here (the model is built on meta)
        head_dim = padded_head_dim(self.head_dim, query.device.type, self.attention_backend, self.pad_head_dim)
        return attention_at_head_dim(query, key, value, head_dim, dropout_p=dropout_p, enable_gqa=self.native_gqa,
                                     attention_mask=visible, scale=self.scale)


def _only_view_left(value: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether `value` is a view sharing storage with none of `others` (outside torch.compile)."""
    if torch.compiler.is_compiling() or value._base is None:
        return False
    return not any(torch._C._is_alias_of(value, other) for other in others)
