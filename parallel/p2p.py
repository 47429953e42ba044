"""Point-to-point between pipeline stages: a send is posted at once and completes at a receive `SEND_LAG` slots later
(or at `finish_sends`), a receive posts its irecv before waiting, so neighbours sending to each other both complete and
a rank holds at most two sends. Messages go through the Communicator, counted on the "pp" group."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from parallel.comm import Communicator

ACTIVATION, GRADIENT = 1, 2  # message tags


SEND_LAG = 2  # a receive at slot k completes the sends of slots <= k - SEND_LAG


def send_lag(pp_size: int, group_size: Optional[int] = None) -> int:
    """SEND_LAG, or 2 + 2 (G - P) with a microbatch group size G above the stages P, whose neighbour reads later."""
    return SEND_LAG if group_size is None or group_size <= pp_size else SEND_LAG + 2 * (group_size - pp_size)


class PipelineP2P:
    def __init__(self, device: torch.device, comm: Communicator, lag: int = SEND_LAG) -> None:
        self.device, self.comm, self.lag = device, comm, lag
        self.slot = 0  # the schedule's slot now running; sends are tagged with it
        self._sends: list = []  # (slot, the send's works, the tensor it keeps alive)

    def start_slot(self) -> None:
        self.slot += 1

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        tensor = tensor.detach().contiguous()
        self._complete_sends(up_to_slot=self.slot - self.lag)  # a slot without a receive completes old sends here
        works = self.comm.send(tensor, peer, tag)
        self._sends.append((self.slot, works, tensor))

    def receive(self, shape: Sequence[int], dtype: torch.dtype, peer: int, tag: int) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        works = self.comm.receive(tensor, peer, tag)
        self._complete_sends(up_to_slot=self.slot - self.lag)
        for work in works:
            work.wait()
        return tensor

    @property
    def held_sends(self) -> int:
        """Sends posted and not yet completed."""
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
