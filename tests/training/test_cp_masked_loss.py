"""A masked loss under context parallelism gives the unsharded gradients, however few tokens are valid and whichever
rank holds them (issue 89, after Megatron-LM PR #7513: "with one valid token, CP=2 halves the gradient and CP=4 reduces
it to one quarter", its core_v0.13+ forward_step_calc_loss dividing each CP rank's masked sum by its own count).

Here a micro-batch's loss (training/evaluation.py micro_batch_loss) is this rank's masked sum x CP over the mask's count
summed over the CP group, and the gradients and the reported loss then take the mean over DP x CP. On CP 2 and 4 ranks
(gloo), each holding its load-balanced chunks of a [2, 16] micro-batch (parallel/context_parallel.py
take_local_chunks, Megatron's get_batch_on_this_cp_rank), every per-token gradient and the loss equal one rank's
masked mean's bit for bit (CP is a power of 2: x CP then / CP is exact), for masks of 0, 1, 2 and all valid tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from data.documents import masked_token_mean
from parallel.context_parallel import take_local_chunks
from parallel.state import destroy, initialize
from tests.distributed import run_distributed

BATCH, SEQ = 2, 16


def _masks() -> dict[str, torch.Tensor]:
    """name: a loss mask [2, 16]; one valid token first in each chunk layout's rank 0, then in its last rank."""
    masks = {}
    for name, valid in (("none", []), ("one token, first chunk", [(0, 0)]), ("one token, last chunk", [(1, 8)]),
                        ("one token, mid sequence", [(1, 5)]), ("two tokens, two samples", [(0, 15), (1, 3)])):
        mask = torch.zeros(BATCH, SEQ)
        for sample, position in valid:
            mask[sample, position] = 1.0
        masks[name] = mask
    masks["all"] = torch.ones(BATCH, SEQ)
    return masks


def _per_token_losses() -> torch.Tensor:
    return torch.rand(BATCH, SEQ, generator=torch.Generator().manual_seed(3)) * 5


def _cp_rank(rank, world_size):
    from training.evaluation import micro_batch_loss

    state = initialize("cpu", context_parallel_size=world_size)
    try:
        results = {}
        for name, mask in _masks().items():
            losses = take_local_chunks(_per_token_losses(), world_size, rank, dim=1).requires_grad_(True)
            loss = micro_batch_loss(losses, SimpleNamespace(loss_mask=take_local_chunks(mask, world_size, rank,
                                                                                        dim=1)), state)
            loss.backward()
            # the mean over DP x CP that the reducer and the reported loss take (DP 1 here)
            # as lists: a tensor would reach the parent through shared memory its process no longer holds
            results[name] = ((loss.detach() / world_size).item(), (losses.grad / world_size).tolist())
        return results
    finally:
        destroy(state)


@pytest.mark.parametrize("cp", [2, 4])
def test_a_masked_loss_under_context_parallelism_gives_one_ranks_gradients(cp):
    per_rank = run_distributed(_cp_rank, cp, timeout=120)
    for name, mask in _masks().items():
        whole = _per_token_losses().requires_grad_(True)
        reference = masked_token_mean(whole, SimpleNamespace(loss_mask=mask))
        reference.backward()
        loss = torch.tensor([results[name][0] for results in per_rank]).sum()
        gradient = torch.zeros(BATCH, SEQ)
        for rank, results in enumerate(per_rank):
            index = take_local_chunks(torch.arange(SEQ).expand(BATCH, SEQ), cp, rank, dim=1)
            gradient.scatter_(1, index, torch.tensor(results[name][1]))
        assert torch.equal(loss, reference.detach()), (name, loss, reference)
        assert torch.equal(gradient, whole.grad), (name, gradient, whole.grad)
