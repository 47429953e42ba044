"""The model's output: the vocabulary-parallel output layer (tied to the word embedding, or Megatron's untied
output_layer) and the loss. Each TP rank scores its slice of the vocabulary; the cross-entropy runs without
gathering the logits, and padding rows never take part in the softmax. Functions of GPTModel's own attributes, so
that its parameters keep their names."""

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
    """Megatron's untied output_layer on the last stage: column-parallel over the padded vocabulary, no bias;
    padding rows start at zero as the embedding's do, so they are the same at every TP size. None where tied."""
    if not (config.output.untie_embeddings_and_output_weights and stage.last):
        return None
    layer = plan.output_linear("output_layer", config.hidden_size,
                               config.padded_vocab_size(plan.state.tensor_parallel_size),
                               init_std=config.init_method_std, vocab_size=config.vocab_size)
    set_init_method(layer.weight, InitMethod.normal(config.init_method_std, rows=config.vocab_size))
    return layer


def output_vocab_start(config: ModelConfig, state: ParallelState) -> int:
    """The global vocabulary index of this rank's first output column: the embedding's row split, also on a last
    pipeline stage whose untied output layer is its only vocabulary shard (no embedding there)."""
    return state.tensor_parallel_rank * (config.padded_vocab_size(state.tensor_parallel_size)
                                         // state.tensor_parallel_size)


def output_of(model: nn.Module, final_hidden: torch.Tensor, labels: Optional[torch.Tensor]) -> torch.Tensor:
    """GPTModel.output: logits [batch, seq, vocab] without labels, the per-token loss with them."""
    config, state = model.config, model.state
    weight = model.word_embeddings.weight if model.output_layer is None else model.output_layer.weight
    with entered_region(final_hidden, state, model.sequence_parallel) as hidden:
        if labels is not None and config.output.cross_entropy_loss_fusion:
            return fused_linear_cross_entropy(hidden, weight, labels, model.output_vocab_start, config.vocab_size,
                                              state)
        logits = F.linear(hidden, weight)
    cap = config.output.final_logit_softcapping
    if cap is not None:  # Gemma 2's: each rank's vocabulary slice, elementwise (Gemma2ForCausalLM.forward)
        logits = torch.tanh(logits / cap) * cap
    if labels is None:
        return gather_from_tensor_parallel_region(logits, state)[..., : config.vocab_size]
    # The softmax runs in fp32 even under bf16 autocast: the loss is the one number we compare.
    return vocab_parallel_cross_entropy(logits, labels, model.output_vocab_start, config.vocab_size, state,
                                        config.output.z_loss_strength)
