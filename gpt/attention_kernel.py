"""The attention kernel of one layer, chosen once at build from its settings: the context-parallel exchange
(gpt/cp_attention.py, by --cp-comm-type), attention sinks (--softmax-type, gpt/attention_sinks.py), soft-capped scores
(--attn-logit-softcapping, gpt/attention_softcap.py) or SDPA (its head dim padded for the fused CUDA kernels,
gpt/attention_padding.py); with the layer's mask (causal, the documents', a KV cache's, a sliding window's), its
dropout on this TP rank's stream, the SDPA kernels of --attention-backend, and grouped keys and values read natively
(SDPA's enable_gqa) or copied per query head."""

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

if TYPE_CHECKING:  # the kernel reads the masks' tensors; importing it loads no data pipeline (tests/test_layering.py)
    from data.documents import DocumentMasks


def sdpa_takes_grouped_kv(attention_backend: str) -> bool:
    """Whether SDPA reads each group's key/value head for its query heads itself (enable_gqa, in every torch
    this project pins: query head i reads key/value head i // (heads / groups), as repeat_interleave's copies
    do), so the copies of k and v per query head are never made. The memory-efficient and cuDNN kernels, all
    that --attention-backend fused allows, do not take enable_gqa in every torch version: that backend keeps
    the copies."""
    return attention_backend != "fused"


def softmax_offset(config: ModelConfig, layout: QKVLayout) -> Optional[torch.nn.Parameter]:
    """--softmax-type learnable's offsets: Megatron-Core's DotProductAttention.softmax_offset, a parameter of this
    rank's heads (split with them, drawn as Megatron's init_method draws it); None for vanilla and off-by-one (zeros)."""
    if config.attention.softmax_type != "learnable":
        return None
    return meta_parameter((layout.heads_per_rank,), InitMethod.normal(config.init_method_std), layout.state,
                          split_dim=0)


class AttentionKernel:
    """Queries, keys and values [batch, heads (or groups), seq, head_dim] to the context [batch, seq, heads x
    head_dim]."""

    def __init__(self, config: ModelConfig, state: ParallelState, layout: QKVLayout, window: Optional[int]):
        """`window`: the layer's sliding window (the keys before each query it sees), or None."""
        attention = config.attention
        self.window, self.head_dim, self.heads = window, config.head_dim, layout.heads_per_rank
        self.attention_backend, self.pad_head_dim = attention.attention_backend, attention.pad_attention_head_dim
        self.dropout_p, self.scale, self.softcap = (attention.attention_dropout, attention.softmax_scale,
                                                    attention.attn_logit_softcapping)
        self.queries_per_key = layout.queries_per_key
        self.native_gqa = self.queries_per_key > 1 and sdpa_takes_grouped_kv(attention.attention_backend)
        self.sinks = attention.softmax_type != "vanilla"
        # With context parallelism the sequence here is this rank's two chunks (parallel/context_parallel.py):
        # attention over the whole sequence (gpt/cp_attention.py).
        self.context_parallel = state if state.context_parallel_size > 1 else None
        self.cp_comm_type = attention.cp_comm_type
        self._attend = self._context_parallel if self.context_parallel is not None else self._with_sinks \
            if self.sinks else self._softcapped if self.softcap is not None else self._sdpa

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 documents: Optional[DocumentMasks], cache: Optional[LayerCache], rng: Optional[TensorParallelRNG],
                 training: bool, offset: Optional[torch.Tensor]) -> torch.Tensor:
        """`cache`: the keys and values of the tokens before these, which they also see; `rng`: this TP rank's
        stream, from which each rank's heads draw their dropout masks; `offset`: the learned sink logits, if any."""
        key, value = self._keys_and_values(query, key, value, cache)
        batch, _, seq, _ = query.shape  # the whole sequence, also when the block's input is a slice of it
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
            # q and k left the projection's output through their own ops (rotary, norms): attention would keep that
            # output whole for the value, a view of it; the value's own copy keeps its heads only, as Megatron-Core
            # keeps its value
            value = value.contiguous()
        if cache is not None:  # stored before the copies per query head: one head per group
            key, value = cache.extend(key, value)
        if repeated:  # query head i reads group i // per_group (transformers' repeat_kv, Megatron-Core's GQA)
            copies = self.queries_per_key
            key, value = key.repeat_interleave(copies, dim=1), value.repeat_interleave(copies, dim=1)
        return key, value

    def _visible(self, seq: int, device: torch.device, documents: Optional[DocumentMasks],
                 cache: Optional[LayerCache]) -> Optional[torch.Tensor]:
        """The bool mask of the keys each query sees (True where visible), or None for causal attention: the
        documents' block-diagonal causal mask (--reset-attention-mask), a KV cache's new tokens over every cached
        key, the sliding window over either (CP's exchange windows by itself)."""
        if cache is not None:
            return cache.visible(seq, self.window, device)
        mask = documents.attention_mask if documents is not None else None
        if self.window is not None and self.context_parallel is None:
            return causal_window_mask(seq, self.window, device, mask)
        return mask

    def _context_parallel(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          visible: Optional[torch.Tensor], documents: Optional[DocumentMasks], dropout_p: float,
                          sinks: Optional[torch.Tensor]) -> torch.Tensor:
        document_ids = documents.document_ids if documents is not None else None  # --reset-attention-mask's
        return context_parallel_attention(query, key, value, self.context_parallel, self.cp_comm_type, dropout_p,
                                          enable_gqa=self.native_gqa, window=self.window, scale=self.scale,
                                          softcap=self.softcap, sinks=sinks, document_ids=document_ids)

    def _with_sinks(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    visible: Optional[torch.Tensor], documents: Optional[DocumentMasks], dropout_p: float,
                    sinks: torch.Tensor) -> torch.Tensor:
        # (with soft-capping refused: gpt/model_config.py)
        return attention_with_sinks(query, key, value, sinks, dropout_p, enable_gqa=self.native_gqa,
                                    attention_mask=visible, scale=self.scale)

    def _softcapped(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    visible: Optional[torch.Tensor], documents: Optional[DocumentMasks], dropout_p: float,
                    sinks: None) -> torch.Tensor:
        # scores SDPA cannot cap: computed explicitly
        return softcapped_attention(query, key, value, self.softcap, self.scale, visible, dropout_p)

    def _sdpa(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: Optional[torch.Tensor],
              documents: Optional[DocumentMasks], dropout_p: float, sinks: None) -> torch.Tensor:
        # the device is known only here (the model is built on meta): whether to pad is decided per call
        head_dim = padded_head_dim(self.head_dim, query.device.type, self.attention_backend, self.pad_head_dim)
        return attention_at_head_dim(query, key, value, head_dim, dropout_p=dropout_p, enable_gqa=self.native_gqa,
                                     attention_mask=visible, scale=self.scale)


def _only_view_left(value: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether `value` is a view that none of `others` shares its storage with (outside torch.compile, whose graph
    keeps what it chooses)."""
    if torch.compiler.is_compiling() or value._base is None:
        return False
    return not any(torch._C._is_alias_of(value, other) for other in others)
