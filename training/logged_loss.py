"""The logged loss as Megatron-LM's training.py reduces it: with a loss mask each micro-batch reports its masked loss
sum and token count, summed over the micro-batches (or evaluation iterations) and DP x CP, and the loss is their
quotient, in either --calculate-per-token-loss mode. Without a mask every micro-batch counts the same tokens: the
numerator is the loss as back-propagated and the denominator 1 a rank, which keeps the mean's arithmetic."""

from __future__ import annotations

from typing import Optional

import torch

from data.documents import DocumentMasking, DocumentMasks
from parallel.state import ParallelState
from training.per_token_loss import token_sum


class LoggedLoss:
    """A rank's running sums of the logged loss: [masked loss sum, token count] with a loss mask, else [loss]."""

    def __init__(self, documents: Optional[DocumentMasking], device: torch.device) -> None:
        self.masked = documents is not None and documents.masks_loss
        self.sums = torch.zeros(2 if self.masked else 1, device=device)

    def add(self, losses: torch.Tensor, masks: Optional[DocumentMasks], loss: Optional[torch.Tensor]) -> None:
        """A micro-batch's per-token `losses`; without a loss mask its `loss` as back-propagated (None with one)."""
        if self.masked:
            self.sums += torch.stack((token_sum(losses.detach(), masks), masks.loss_mask.sum().float()))
        else:
            self.sums += loss.detach()

    def average_over(self, micro_batches: int) -> None:
        """Evaluation without a loss mask: the mean over its micro-batches (with one the sums stand)."""
        if not self.masked:
            self.sums /= micro_batches

    def reduce(self, state: ParallelState) -> torch.Tensor:
        """The logged loss: the sums over DP x CP, numerator over denominator (DP x CP without a mask)."""
        sums, size = self.sums, state.data_context_parallel_size
        if size > 1:
            state.comm.all_reduce(sums, state.data_context_parallel_group, "dp")
        if self.masked:
            return sums[0] / sums[1].clamp(min=1.0)  # a global batch with no token logs 0
        return sums[0] / size if size > 1 else sums[0]
