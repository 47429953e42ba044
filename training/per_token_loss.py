"""--calculate-per-token-loss as Megatron-LM defines it: the iteration's loss is the masked sum of every micro-batch's
per-token losses over the token count summed over DP x CP. The count is known before the first forward, so each
micro-batch's sum is scaled by `token_scale` and the reducer's mean gives Megatron's sum / count."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from data.documents import DocumentMasks
from parallel.state import ParallelState


def token_count(labels: torch.Tensor, masks: Optional[DocumentMasks]) -> torch.Tensor:
    """This rank's tokens of one micro-batch the loss counts."""
    if masks is not None and masks.loss_mask is not None:
        return masks.loss_mask.float().sum()
    return torch.tensor(float(labels.numel()), device=labels.device)


def token_sum(losses: torch.Tensor, masks: Optional[DocumentMasks]) -> torch.Tensor:
    """A micro-batch's summed per-token losses in fp32, masked where a loss mask is."""
    if masks is not None and masks.loss_mask is not None:
        return (losses.float() * masks.loss_mask).sum()
    return losses.float().sum()


def token_scale(counts: Sequence[torch.Tensor], state: ParallelState) -> torch.Tensor:
    """DP x CP over the iteration's DP x CP token count: what each micro-batch's summed loss is multiplied by."""
    total = torch.stack(list(counts)).sum()
    size = state.data_context_parallel_size
    if size > 1:
        state.comm.all_reduce(total, state.data_context_parallel_group, "dp")
    return size / total.clamp(min=1.0)
