"""--calculate-per-token-loss, as Megatron-LM defines it: the iteration's loss is the sum of every micro-batch's
(masked) per-token losses over its token count summed over DP x CP, not the mean of each micro-batch's mean.

Megatron-LM: forward_step_calc_loss (megatron/core/pipeline_parallel/schedules.py) leaves each micro-batch's masked sum
undivided (`if not config.calculate_per_token_loss: output_tensor /= num_tokens; /= num_microbatches`); the data-parallel
reduction sums instead of averaging (distributed_data_parallel.py: gradient_scaling_factor 1.0); finalize_model_grads
broadcasts the token count from the last pipeline stage, all-reduces it over DP x CP and scales every gradient by
1 / count; the MoE balancing losses are multiplied by the tokens their router saw (router.py: "To correct this
scaling, we need to scale the aux_loss by num_local_tokens") and backward at the loss scale alone, the MTP losses are
sums too (gpt_model.py: `mtp_loss_scale * mtp_loss`, not over num_tokens).

Here every rank reads its iteration's micro-batches before the first forward (the pipeline schedule does anyway), so
the count is known up front: one all-reduce of it over DP x CP, and each micro-batch's loss is its masked sum x
`token_scale` = DP x CP / count, which the reducer's mean over DP x CP turns into Megatron's sum / count. The same
scale goes to the balancing and MTP losses' backward. The recorded loss is then Megatron's logged `lm loss`, the
iteration's masked sum over its count."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from data.documents import DocumentMasks
from parallel.state import ParallelState


def token_count(labels: torch.Tensor, masks: Optional[DocumentMasks]) -> torch.Tensor:
    """This rank's tokens of one micro-batch that the loss counts (its CP chunks'): the loss mask's sum, or all."""
    if masks is not None and masks.loss_mask is not None:
        return masks.loss_mask.float().sum()
    return torch.tensor(float(labels.numel()), device=labels.device)


def token_sum(losses: torch.Tensor, masks: Optional[DocumentMasks]) -> torch.Tensor:
    """A micro-batch's summed per-token losses in fp32, masked where a loss mask is."""
    if masks is not None and masks.loss_mask is not None:
        return (losses.float() * masks.loss_mask).sum()
    return losses.float().sum()


def token_scale(counts: Sequence[torch.Tensor], state: ParallelState) -> torch.Tensor:
    """DP x CP over the iteration's token count summed over DP x CP (at least 1, as Megatron's `if num_tokens > 0`):
    what each micro-batch's summed loss is multiplied by. No autograd through it, and no host read."""
    total = torch.stack(list(counts)).sum()
    size = state.data_context_parallel_size
    if size > 1:
        state.comm.all_reduce(total, state.data_context_parallel_group, "dp")
    return size / total.clamp(min=1.0)
