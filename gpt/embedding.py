"""The model's input: the vocab-parallel word embedding, learned positions where configured, and embedding dropout,
built on GPTModel's own attributes so parameter names stay the same in every checkpoint format."""

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
    """On the first stage, and on the last where it holds a copy (tied, or MTP). Under SP the lookup's TP sum is a
    reduce-scatter (Megatron-Core's reduce_scatter_embeddings); learned positions are added to the whole sequence first,
    then split."""
    if not (stage.first or (stage.last and shares_word_embedding)):
        return None
    embedding = plan.embedding("word_embeddings", config.vocab_size,
                               config.padded_vocab_size(plan.state.tensor_parallel_size), config.hidden_size,
                               init_std=config.init_method_std, scatter_in_lookup=not _learned_positions(config))
    if not stage.first:
        # the last stage's copy of the first's: a replica over pipeline stages, the first's the one a checkpoint saves
        also_replicated_over(embedding.weight, "pp")
    return embedding


def build_position_embedding(config: ModelConfig, stage: StageLayers) -> Optional[nn.Embedding]:
    if not (_learned_positions(config) and stage.first):
        return None
    # `_weight` skips nn.Embedding's pointless init on meta
    embedding = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                             _weight=torch.empty(config.max_position_embeddings, config.hidden_size, device="meta"))
    set_init_method(record_whole(embedding.weight), InitMethod.normal(config.init_method_std))
    return embedding


def embed_tokens(model: nn.Module, tokens: torch.Tensor, documents: Optional["DocumentMasks"] = None,
                 positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    config, state = model.config, model.state
    hidden = model.word_embeddings(tokens)
    if config.output.scale_embeddings_by_sqrt_hidden:
        # Gemma's normalizer sqrt(hidden), rounded to the embedding's dtype as transformers'
        hidden = hidden * torch.tensor(math.sqrt(config.hidden_size), dtype=hidden.dtype)
    if model.position_embeddings is not None:
        # --reset-position-ids' per-document positions, else under CP its chunks' global positions
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
