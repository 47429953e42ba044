"""Point-to-point between pipeline stages: sends that never wait, receives that are waited before use.

Megatron-Core's p2p_communication.py batches its isend/irecv with torch.distributed.batch_isend_irecv; here
a send is posted at once and only completed at the end of the iteration (`finish_sends`), and a receive is
waited where its tensor is needed. With sends that never block, any schedule that is valid as a data flow
(parallel/pipeline_schedules.py's test simulates each) cannot deadlock. The shapes are known on both sides
([micro-batch, sequence, hidden], the sequence a TP rank's slice under sequence parallelism: the caller says),
so no shape is exchanged. Activations and gradients travel with
different tags: with interleaving, one pair of ranks carries both, in orders that differ.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

ACTIVATION, GRADIENT = 1, 2  # message tags


class PipelineP2P:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sends: list = []  # the works of posted sends, and the tensors they must keep alive

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        tensor = tensor.detach().contiguous()
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, tag=tag)])
        self._sends.append((works, tensor))

    def receive(self, shape: Sequence[int], dtype: torch.dtype, peer: int, tag: int) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, peer, tag=tag)]):
            work.wait()
        return tensor

    def finish_sends(self) -> None:
        for works, _ in self._sends:
            for work in works:
                work.wait()
        self._sends.clear()
