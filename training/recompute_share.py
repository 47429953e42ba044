"""The share of the blocks' forward that runs again in backward under --checkpoint-activations (all of it under uniform,
the first --checkpoint-num-layers blocks of each chunk under block), which the FLOPs count and the planner's time models
price."""

from __future__ import annotations

from typing import Optional

from arguments.config import PretrainConfig
from training.build import config_stage_layers


def chunk_layer_counts(config: PretrainConfig, pipeline_rank: Optional[int] = None) -> list[int]:
    """The blocks of each model chunk of `pipeline_rank` (of every rank where None)."""
    stages = config.parallel.pipeline_model_parallel_size
    if stages == 1:
        return [config.model.num_layers]
    ranks = range(stages) if pipeline_rank is None else (pipeline_rank,)
    return [len(chunk) for rank in ranks for chunk in config_stage_layers(config, rank).chunks]


def recomputed_share(config: PretrainConfig, pipeline_rank: Optional[int] = None) -> float:
    """The share of `pipeline_rank`'s blocks whose forward runs again in backward."""
    activations = config.activations
    chunks = chunk_layer_counts(config, pipeline_rank)
    if not activations.checkpoint_activations or not sum(chunks):
        return 0.0
    recomputed = sum(end - first for layers in chunks
                     for first, end, checkpointed in activations.checkpointed_groups(layers) if checkpointed)
    return recomputed / sum(chunks)
