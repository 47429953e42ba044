"""ZeRO's gradients across pipeline stages: the tied word embedding's two copies, and the norm.

With pipeline stages the first stage holds the word embedding and the last stage a second copy of it as
the output layer (tied). Megatron keeps the two equal by all-reducing their gradients over the embedding
group (first and last stage) after the data-parallel reduction (megatron/core/distributed/finalize_model_grads.py,
`_allreduce_word_embedding_grads`); both copies then take the same step. Here the copy is a ZeRO unit of its
own on both stages (zero/apply.py's `own_units`), so after the reduction each rank's shard of it covers the
same elements on both stages and the two shards are summed in place, at every ZeRO stage 0-2.

The gradient norm is summed over the pipeline group too, counting the shared embedding once (Megatron's
`param_is_not_shared` leaves the last stage's copy out of the norm); every stage then clips by the same
norm and agrees on an fp16 overflow.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from zero.apply import ZeroParts


class PipelineGradients:
    def __init__(self, zero: ZeroParts, shared_embedding: Optional[nn.Parameter], embedding_group,
                 pipeline_group, first_stage: bool) -> None:
        # The norm sums over the stages once, after a chain of optimizers (zero/experts.py) has added its parts'
        # shares; the tied embedding is in the dense part.
        zero.optimizer.pipeline_group = pipeline_group
        zero = zero.dense if hasattr(zero, "dense") else zero
        self.zero, self.embedding_group = zero, embedding_group
        self.unit = None
        layout = zero.optimizer.layout
        if shared_embedding is not None and embedding_group is not None:
            self.unit = layout.unit_of[id(shared_embedding)]
            if len(self.unit.slots) != 1:
                raise ValueError("the tied embedding must be a ZeRO unit of its own (apply_zero's own_units)")
            if not first_stage:  # counted once, on the first stage
                start = self.unit.partition_offset
                zero.optimizer.norm_excluded.append((start, start + self.unit.shard_numel))

    def sum_shared_embedding(self) -> None:
        """After the last micro-batch's `finish_grad_sync`, before the step."""
        if self.unit is not None:
            shard = self.zero.reducer.reduced_shard(self.unit)
            summed = shard.to(torch.float32)  # sums in fp32 whatever the gradient dtype
            self.zero.optimizer.comm.all_reduce(summed, self.embedding_group, "embedding")
            shard.copy_(summed)
