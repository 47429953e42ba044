"""The share of the blocks' forward that runs again in backward under --checkpoint-activations (all of it under uniform,
the first --checkpoint-num-layers blocks of each chunk under block), which the FLOPs count and the planner's time models
price."""

from __future__ import annotations

from typing import Optional

from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig
from training.build import config_stage_layers
from zero.config import ActivationCheckpointConfig


def chunk_layer_counts(model: ModelConfig, parallel: ParallelismConfig, pipeline_rank: Optional[int] = None) -> list[int]:
    """The blocks of each model chunk of `pipeline_rank` (of every rank where None)."""
    stages = parallel.pipeline_model_parallel_size
    if stages == 1:
        return [model.num_layers]
    ranks = range(stages) if pipeline_rank is None else (pipeline_rank,)
    return [len(chunk) for rank in ranks for chunk in config_stage_layers(model, parallel, rank).chunks]


def recomputed_share(activations: ActivationCheckpointConfig, model: ModelConfig, parallel: ParallelismConfig,
                     pipeline_rank: Optional[int] = None) -> float:
    """The share of `pipeline_rank`'s blocks whose forward runs again in backward."""
    chunks = chunk_layer_counts(model, parallel, pipeline_rank)
    if not activations.checkpoint_activations or not sum(chunks):
        return 0.0
    recomputed = sum(end - first for layers in chunks
                     for first, end, checkpointed in activations.checkpointed_groups(layers) if checkpointed)
    return recomputed / sum(chunks)
