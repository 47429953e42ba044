"""Point-to-point between pipeline stages: a send completes at a later receive of its rank, a receive is
waited before use.

Megatron-Core's p2p_communication.py batches a slot's sends with the next receive and waits them together, so a rank
holds no send for long. Here a send is posted at once, tagged with its slot; a receive posts its irecv first, then
waits for the sends of every slot before the previous one (`SEND_LAG`), then for itself, and a slot that receives
nothing (the first stage's forwards, the last stage's backwards) waits for them before its own send; the sends left
complete at the iteration's end (`finish_sends`). Posting the receive first lets two neighbours that send to each other both
complete; leaving the previous slot's sends open is what interleaved 1F1B needs. tests/parallel/
test_pipeline_schedules.py simulates this rule on every schedule up to 8 stages x 5 chunks: none deadlocks, and a
rank holds at most two sends at once (waited only at receives, the first stage held its whole warm-up's: 9 at PP 8
VP 5; held to the iteration's end they grew with the micro-batches: 144 GiB a GPU at Megatron's GPT-3 175B). The shapes are known on both sides ([micro-batch, sequence, hidden], the sequence a TP
rank's slice under SP: the caller says), so none is exchanged; activations and gradients travel with different tags.

The messages go through the Communicator (parallel/comm.py's `send` / `receive`), counted on the "pp" group like
every other byte; with the planner's DryRunCommunicator the same class runs a planned stage on the meta device
(planner/pipeline_plan.py), so what it counts and holds is what a live rank would."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from parallel.comm import Communicator

ACTIVATION, GRADIENT = 1, 2  # message tags


SEND_LAG = 2  # a receive at slot k completes the sends of slots <= k - SEND_LAG


def send_lag(pp_size: int, group_size: Optional[int] = None) -> int:
    """SEND_LAG, or with --microbatch-group-size-per-virtual-pipeline-stage G above the stages P, 2 + 2 (G - P):
    the neighbour then reads a larger group's messages later than the two slots on (its warm-up has
    (vp - 1) x G forwards), and SEND_LAG alone deadlocks (tests/parallel/test_pipeline_schedules.py simulates it:
    the lag needed stays at or under this bound)."""
    return SEND_LAG if group_size is None or group_size <= pp_size else SEND_LAG + 2 * (group_size - pp_size)


class PipelineP2P:
    def __init__(self, device: torch.device, comm: Communicator, lag: int = SEND_LAG) -> None:
        self.device, self.comm, self.lag = device, comm, lag
        self.slot = 0  # the schedule's slot now running (start_slot); sends are tagged with it
        self._sends: list = []  # (slot, the works of a posted send, the tensor it must keep alive)

    def start_slot(self) -> None:
        self.slot += 1

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        tensor = tensor.detach().contiguous()
        self._complete_sends(up_to_slot=self.slot - self.lag)  # a slot without a receive waits here (see above)
        works = self.comm.send(tensor, peer, tag)
        self._sends.append((self.slot, works, tensor))

    def receive(self, shape: Sequence[int], dtype: torch.dtype, peer: int, tag: int) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        works = self.comm.receive(tensor, peer, tag)
        self._complete_sends(up_to_slot=self.slot - self.lag)  # with the receive posted (see the docstring)
        for work in works:
            work.wait()
        return tensor

    @property
    def held_sends(self) -> int:
        """Sends posted and not yet completed (each keeps its tensor alive)."""
        return len(self._sends)

    def finish_sends(self) -> None:
        self._complete_sends(up_to_slot=self.slot)
        self.slot = 0

    def _complete_sends(self, up_to_slot: int) -> None:
        for slot, works, _ in self._sends:
            if slot <= up_to_slot:
                for work in works:
                    work.wait()
        self._sends = [send for send in self._sends if send[0] > up_to_slot]
