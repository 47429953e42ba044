"""The start-up lines about MoE options that Megatron-Core defines by what one rank sees, so the same global batch
trains otherwise at another layout: global_aux_loss depends on the DP size, --moe-expert-capacity-factor on the TP (with
--sequence-parallel) and CP sizes. They are kept as Megatron-Core defines them, and said once."""

from __future__ import annotations

from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig


def moe_notes(model: ModelConfig, parallel: ParallelismConfig, tensor_parallel_size: int,
              data_parallel_size: int) -> tuple[str, ...]:
    """The lines for a run of `config` on a TP x DP grid."""
    moe = model.moe
    if moe is None or moe.deepspeed.gating != "megatron":
        return ()
    return (negative_capacity_note(model) + global_aux_loss_note(model, data_parallel_size)
            + capacity_note(model, parallel, tensor_parallel_size))


def negative_capacity_note(model: ModelConfig) -> tuple[str, ...]:
    """A negative --moe-expert-capacity-factor is no capacity, as Megatron-Core reads it; said once."""
    factor = model.experts.expert_capacity_factor
    if factor is None or factor >= 0:
        return ()
    return (f"> --moe-expert-capacity-factor {factor:g}: a negative factor is no capacity, every routed token kept "
            f"(dropless), as Megatron-Core's TransformerConfig reads it",)


def global_aux_loss_note(model: ModelConfig, data_parallel_size: int) -> tuple[str, ...]:
    moe = model.moe
    if moe.router_load_balancing_type != "global_aux_loss" or moe.aux_loss_coeff <= 0 or data_parallel_size == 1:
        return ()
    return (f"> --moe-router-load-balancing-type global_aux_loss depends on the data-parallel size ({data_parallel_size}) "
            f"as in Megatron-Core: each micro-batch's balancing loss counts the tokens per expert of every data-parallel "
            f"rank, averaged over the iteration's micro-batches so far (TopKRouter._apply_global_aux_loss), so the same "
            f"global batch trains otherwise at another data-parallel size",)


def capacity_note(model: ModelConfig, parallel: ParallelismConfig, tensor_parallel_size: int) -> tuple[str, ...]:
    factor = model.moe.expert_capacity_factor
    sliced_by_tp = tensor_parallel_size > 1 and parallel.sequence_parallel
    context = parallel.context_parallel_size
    if factor is None or not (sliced_by_tp or context > 1):
        return ()
    sizes = ([f"tensor-parallel size ({tensor_parallel_size}, --sequence-parallel)"] if sliced_by_tp else []) + \
        ([f"context-parallel size ({context})"] if context > 1 else [])
    return (f"> --moe-expert-capacity-factor {factor:g} depends on the {' and the '.join(sizes)} as in Megatron-Core: "
            f"each rank's capacity, ceil(tokens x k / experts x factor), counts the tokens it routes, its share of the "
            f"sequence (moe_utils.apply_router_token_dropping), so other tokens are dropped at another size",)
