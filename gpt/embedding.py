"""The model's input: the vocabulary-parallel word embedding, learned absolute positions where the config has them,
and the embedding dropout. Built and run as functions of GPTModel's own attributes, so that its parameters keep their
names (`word_embeddings.weight`, `position_embeddings.weight`) in every checkpoint format and HF family."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from gpt.model_config import ModelConfig
from gpt.parallel_plan import TensorParallelPlan
from gpt.stage_layers import StageLayers
from parallel.context_parallel import positions_on_this_rank
from parallel.init import InitMethod, set_init_method
from parallel.mappings import scatter_to_sequence_parallel_region
from parallel.random import dropout_stream
from parallel.sharding import also_replicated_over, record_whole

if TYPE_CHECKING:
    from data.documents import DocumentMasks


def _learned_positions(config: ModelConfig) -> bool:
    return config.positions.position_embedding_type == "learned_absolute"


def build_word_embedding(config: ModelConfig, plan: TensorParallelPlan, stage: StageLayers,
                         shares_word_embedding: bool) -> Optional[nn.Module]:
    """On the first stage, and on the last where it holds a copy (tied, or its MTP layers embed tokens). With
    nothing added after the lookup, the lookup's sum over TP ranks is a reduce-scatter along the sequence
    (Megatron-Core's LanguageModelEmbedding: reduce_scatter_embeddings); learned positions are added to the whole
    sequence first and then split, as there, so their gradient stays whole."""
    if not (stage.first or (stage.last and shares_word_embedding)):
        return None
    embedding = plan.embedding("word_embeddings", config.vocab_size,
                               config.padded_vocab_size(plan.state.tensor_parallel_size), config.hidden_size,
                               init_std=config.init_method_std, scatter_in_lookup=not _learned_positions(config))
    if not stage.first:
        # the last stage's copy of the first stage's (gradients summed): a replica over the pipeline stages, the
        # first stage's the one a checkpoint saves (parallel/sharding.py)
        also_replicated_over(embedding.weight, "pp")
    return embedding


def build_position_embedding(config: ModelConfig, stage: StageLayers) -> Optional[nn.Embedding]:
    if not (_learned_positions(config) and stage.first):
        return None
    # `_weight` skips nn.Embedding's own (pointless, on meta) initialisation.
    embedding = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                             _weight=torch.empty(config.max_position_embeddings, config.hidden_size, device="meta"))
    set_init_method(record_whole(embedding.weight), InitMethod.normal(config.init_method_std))
    return embedding


def embed_tokens(model: nn.Module, tokens: torch.Tensor, documents: Optional["DocumentMasks"] = None,
                 positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """GPTModel.embed: see there."""
    config, state = model.config, model.state
    hidden = model.word_embeddings(tokens)
    if config.output.scale_embeddings_by_sqrt_hidden:
        # Gemma's normalizer sqrt(hidden), rounded to the embedding's dtype as transformers' ScaledWordEmbedding
        # (`self.embed_scale.to(self.weight.dtype)`); elementwise, so also on a sequence-parallel slice
        hidden = hidden * torch.tensor(math.sqrt(config.hidden_size), dtype=hidden.dtype)
    if model.position_embeddings is not None:
        # --reset-position-ids' per-document positions (with context parallelism, this rank's chunks of the
        # whole sample's: data/documents_cp.py); else, with context parallelism, its chunks' global positions
        if positions is None:
            positions = documents.position_ids if documents is not None else None
        if positions is None:
            positions = positions_on_this_rank(tokens.shape[1], state, tokens.device)
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = hidden + model.position_embeddings(positions)
        if model.sequence_parallel:
            hidden = scatter_to_sequence_parallel_region(hidden, state)
    with dropout_stream(model.split_dropout_rng):
        return model.embedding_dropout(hidden)
