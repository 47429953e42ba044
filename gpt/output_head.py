"""The model's output: the vocab-parallel output layer (tied or untied) and the loss, computed without gathering the
logits; padding rows never enter the softmax."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from gpt.model_config import ModelConfig
from gpt.parallel_plan import TensorParallelPlan
from gpt.stage_layers import StageLayers
from parallel.cross_entropy import vocab_parallel_cross_entropy
from parallel.fused_linear_cross_entropy import fused_linear_cross_entropy
from parallel.init import InitMethod, set_init_method
from parallel.layers import entered_region
from parallel.mappings import gather_from_tensor_parallel_region
from parallel.state import ParallelState


def build_output_layer(config: ModelConfig, plan: TensorParallelPlan, stage: StageLayers):
    """Megatron's untied output_layer on the last stage: column-parallel over the padded vocabulary, no bias, padding
    rows zero; None where tied."""
    if not (config.output.untie_embeddings_and_output_weights and stage.last):
        return None
    layer = plan.output_linear("output_layer", config.hidden_size,
                               config.padded_vocab_size(plan.state.tensor_parallel_size),
                               init_std=config.init_method_std, vocab_size=config.vocab_size)
    set_init_method(layer.weight, InitMethod.normal(config.init_method_std, rows=config.vocab_size))
    return layer


def output_vocab_start(config: ModelConfig, state: ParallelState) -> int:
    """The global vocabulary index of this rank's first output column."""
    return state.tensor_parallel_rank * (config.padded_vocab_size(state.tensor_parallel_size)
                                         // state.tensor_parallel_size)


def output_of(model: nn.Module, final_hidden: torch.Tensor, labels: Optional[torch.Tensor]) -> torch.Tensor:
    config, state = model.config, model.state
    weight = model.word_embeddings.weight if model.output_layer is None else model.output_layer.weight
    with entered_region(final_hidden, state, model.sequence_parallel) as hidden:
        if labels is not None and config.output.cross_entropy_loss_fusion:
            return fused_linear_cross_entropy(hidden, weight, labels, model.output_vocab_start, config.vocab_size,
                                              state)
        logits = F.linear(hidden, weight)
    cap = config.output.final_logit_softcapping
    if cap is not None:  # Gemma 2's logit soft-capping, elementwise per vocabulary slice
        logits = torch.tanh(logits / cap) * cap
    if labels is None:
        return gather_from_tensor_parallel_region(logits, state)[..., : config.vocab_size]
    # fp32 softmax even under bf16 autocast: the loss is the one number we compare
    return vocab_parallel_cross_entropy(logits, labels, model.output_vocab_start, config.vocab_size, state,
                                        config.output.z_loss_strength)
