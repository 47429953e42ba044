"""Drop-and-pad dispatch (--moe-pad-expert-input-to-capacity, gpt/moe/expert_rows.py CapacityRouting): each expert's
tokens found by a sort of the padded map (Megatron-Core's moe_utils.permute with drop_and_pad) and every split a
shape, so nothing is read back to the host (tests/training/test_host_syncs_per_micro_batch.py). The same routing
given as choices ([T, K'] with K' the most experts any token has, gpt/moe/dispatcher.py choices_of; K' read back
here, by the test) is the reference: the padded dispatch gives the same rows in the same order to the same experts,
and the same outputs and gradients, BITWISE (fp32), at expert-parallel size 1 and over an EP 2 all-to-all and
all-gather.
"""

from __future__ import annotations

import pytest
import torch

from gpt.moe.dispatcher import LocalDispatcher, choices_of
from gpt.moe.dispatchers import AllGatherDispatcher, AllToAllDispatcher
from gpt.moe.expert_rows import capacity_routing
from gpt.moe.router import drop_tokens, padded_capacity
from parallel.state import destroy, initialize
from tests.distributed import run_distributed

NUM_EXPERTS, HIDDEN, TOPK, TOKENS = 4, 8, 2, 10


def _routing(seed: int, factor: float):
    """hidden [T, H], the router's padded (probs, map) [T, E] (top-2 of a softmax, padded by probability), the
    loss's weights."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator)
    scores = torch.softmax(torch.randn(TOKENS, NUM_EXPERTS, generator=generator), dim=-1)
    top = scores.topk(TOPK, dim=-1).indices
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(1, top, True)
    probs, routing_map = drop_tokens(scores * chosen, chosen, TOPK, factor, "probs", pad_to_capacity=True)
    return hidden, probs, routing_map, torch.randn(TOKENS, HIDDEN, generator=generator)


def _expert_weight(expert: int) -> torch.Tensor:
    return torch.randn(HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(100 + expert)) / HIDDEN ** 0.5


def _run(dispatcher, experts: list[int], hidden, probs, routing_map, loss_weights, capacity=None) -> dict:
    """dispatch (padded to `capacity`, or as choices where None) -> each local expert (a Linear) -> combine;
    loss = sum(output x weights)."""
    hidden, probs = hidden.clone().requires_grad_(), probs.clone().requires_grad_()
    weights = {e: _expert_weight(e).requires_grad_() for e in experts}
    if capacity is not None:
        rows, sizes = dispatcher.dispatch_to_capacity(hidden, capacity_routing(probs, routing_map, capacity))
    else:
        width = int(routing_map.sum(dim=1).max())  # K': the reference reads it; the padded path needs no such read
        rows, sizes = dispatcher.dispatch(hidden, *choices_of(probs, routing_map, width))
    outputs = torch.cat([chunk @ weights[e].t() for chunk, e in zip(rows.split(sizes), experts)])
    output = dispatcher.combine(outputs)
    (output * loss_weights).sum().backward()
    return dict(rows=rows.detach(), sizes=sizes, output=output.detach(), hidden_grad=hidden.grad,
                probs_grad=probs.grad, **{f"weight_grad {e}": weights[e].grad for e in experts})


def _assert_bitwise(padded: dict, reference: dict) -> None:
    assert padded["sizes"] == reference["sizes"]
    for name, value in reference.items():
        if name != "sizes":
            assert torch.equal(padded[name], value), name


@pytest.mark.parametrize("factor, most_experts_a_token", [(1.0, 3), (0.5, 2), (3.0, 4)],
                         ids=["capacity", "half", "above_the_tokens"])
def test_padded_local_dispatch_is_the_choices_dispatch_bitwise(factor, most_experts_a_token):
    """Capacity 5 (a token padded into 3 experts), 3 (chosen tokens dropped) and 15 > 10 tokens (every token in every
    expert: padded_capacity is the tokens)."""
    hidden, probs, routing_map, loss_weights = _routing(0, factor)
    capacity = padded_capacity(TOKENS, NUM_EXPERTS, TOPK, factor)
    assert routing_map.sum(dim=0).tolist() == [capacity] * NUM_EXPERTS
    assert int(routing_map.sum(dim=1).max()) == most_experts_a_token
    experts = list(range(NUM_EXPERTS))
    padded = _run(LocalDispatcher(NUM_EXPERTS), experts, hidden, probs, routing_map, loss_weights, capacity)
    reference = _run(LocalDispatcher(NUM_EXPERTS), experts, hidden, probs, routing_map, loss_weights)
    assert padded["sizes"] == [capacity] * NUM_EXPERTS
    _assert_bitwise(padded, reference)


def _ep2_worker(rank, world_size, kind, factor):
    state = initialize("cpu", 1, expert_model_parallel_size=2)
    dispatcher_class = {"alltoall": AllToAllDispatcher, "allgather": AllGatherDispatcher}[kind]
    experts = [2 * rank, 2 * rank + 1]
    capacity = padded_capacity(TOKENS, NUM_EXPERTS, TOPK, factor)
    runs = {padded: _run(dispatcher_class(state.experts, NUM_EXPERTS, state.comm), experts, *_routing(rank, factor),
                         capacity if padded else None) for padded in (True, False)}
    destroy(state)
    return {padded: {name: value.numpy() if torch.is_tensor(value) else value for name, value in run.items()}
            for padded, run in runs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind, factor", [("alltoall", 1.0), ("allgather", 0.5)])
def test_padded_expert_parallel_dispatch_is_the_choices_dispatch_bitwise(kind, factor):
    """EP 2, each rank its own tokens padded to its own capacity; every split of the padded exchange is a shape. (The
    allgather's choices reference gathers every rank's [T, K'], so it runs where K' is k on both ranks.)"""
    for result in run_distributed(_ep2_worker, 2, kind, factor, timeout=120):
        padded, reference = ({name: torch.from_numpy(v) if hasattr(v, "dtype") else v for name, v in run.items()}
                             for run in (result[True], result[False]))
        _assert_bitwise(padded, reference)
