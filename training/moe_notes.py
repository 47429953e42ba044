"""The start-up lines about MoE options whose math is not what was typed or depends on the layout.

Megatron-Core defines two routing options by what one rank sees, so the same global batch trains otherwise at
another size of one dimension of the grid; they are kept as Megatron-Core defines them (a run here equals
Megatron-LM's at the same layout) and said once at the start, when that dimension is above 1:

- `--moe-router-load-balancing-type global_aux_loss` (TopKRouter._apply_global_aux_loss, megatron/core/transformer/
  moe/router.py): each micro-batch's loss counts the tokens per expert summed over the tp_dp_cp group and averaged
  over the iteration's micro-batches so far. TP and CP slices add up to the micro-batch's sequences, whatever their
  number; the data-parallel ranks add other micro-batches, so the loss depends on the data-parallel size.
- `--moe-expert-capacity-factor` (moe_utils.apply_router_token_dropping, called by the router before dispatch):
  capacity = ceil(tokens x k / experts x factor) over the tokens this rank routes, its 1/TP of the sequence under
  --sequence-parallel and its 1/CP under context parallelism, so which tokens are dropped depends on the
  tensor-parallel and context-parallel sizes; not on the data-parallel or the expert-parallel size (each rank drops
  among its own tokens before any is sent).

Measured here (4 experts, top-2, 3 iterations against one rank at global batch 8): global_aux_loss moved losses and
grad norms by up to 4.6e-3 at DP 2 and 4, and by under 2e-7 at TP 2 with --sequence-parallel and at CP 2; capacity
factor 0.5 by 7.4e-3 at TP 2 with --sequence-parallel and 5.9e-3 at CP 2, and by under 2e-7 at DP 2 and at EP 2.
"""

from __future__ import annotations

from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig


def moe_notes(model: ModelConfig, parallel: ParallelismConfig, tensor_parallel_size: int,
              data_parallel_size: int) -> tuple[str, ...]:
    """The lines for a run of `config` on a grid of `tensor_parallel_size` x `data_parallel_size` (module docstring)."""
    moe = model.moe
    if moe is None or moe.deepspeed.gating != "megatron":
        return ()
    return (negative_capacity_note(model) + global_aux_loss_note(model, data_parallel_size)
            + capacity_note(model, parallel, tensor_parallel_size))


def negative_capacity_note(model: ModelConfig) -> tuple[str, ...]:
    """A negative --moe-expert-capacity-factor is no capacity, as Megatron-Core reads it (TransformerConfig.__post_init__
    sets it to None; gpt/model_config.py's `moe` does the same), said once: the value typed is not the one used."""
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
