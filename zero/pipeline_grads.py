"""ZeRO's gradients across pipeline stages: the tied word embedding's two copies (first and last stage, each a ZeRO unit
of its own) are summed over the embedding group after the DP reduction, and the norm counts them once."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from zero.apply import ZeroParts


class PipelineGradients:
    def __init__(self, zero: ZeroParts, shared_embedding: Optional[nn.Parameter], embedding_group,
                 pipeline_group, first_stage: bool) -> None:
        # The norm sums over the stages once, after a chain's parts.
        zero.optimizer.pipeline_group = pipeline_group
        zero = zero.dense if hasattr(zero, "dense") else zero
        self.zero, self.embedding_group = zero, embedding_group
        self.unit = None
        layout = zero.optimizer.layout
        if shared_embedding is not None and embedding_group is not None:
            self.unit = layout.unit_of[id(shared_embedding)]
            if len(self.unit.slots) != 1:
                raise ValueError("the tied embedding must be a ZeRO unit of its own (apply_zero's own_units)")
            if not first_stage:
                start = self.unit.partition_offset
                zero.optimizer.norm_excluded.append((start, start + self.unit.shard_numel))

    def sum_shared_embedding(self) -> None:
        """After the last micro-batch's `finish_grad_sync`, before the step."""
        if self.unit is not None:
            shard = self.zero.reducer.reduced_shard(self.unit)
            summed = shard.to(torch.float32)
            self.zero.optimizer.comm.all_reduce(summed, self.embedding_group, "embedding")
            shard.copy_(summed)
