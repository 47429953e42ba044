"""zero/experts.py: expert parameters' gradients reduced, and their optimizer states partitioned, over the expert
data-parallel group; one gradient norm over all parameters.

Megatron-Core is the specification: megatron/core/distributed/distributed_data_parallel.py (expert gradients
scaled by 1 / data_parallel_world_size, then reduced over the expert data-parallel group), its two
DistributedOptimizers chained (megatron/core/optimizer/optimizer.py, ChainedOptimizer.get_grad_norm: one norm
from each part's squares), and the expert grid of megatron/core/parallel_state.py.

A minimal model: a dense Linear, then 4 "experts" (Linears whose sharding records make them experts, weight seeded
by the expert) behind the alltoall dispatcher with a fixed top-2 routing. EP 2 over world 2 (DP 2, expert DP 1) and world 4 (DP 4,
expert DP 2) at ZeRO 0, 1, 2 and 3 against EP 1 on one process holding every rank's tokens under plain build_zero
(one part, one norm): losses and gradient norms over 5 iterations within 1e-6 relative (not bitwise: the
DP sums run in another order than one process's single backward).
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from arguments.config import OptimizerConfig
from gpt.moe.dispatchers import AllToAllDispatcher
from parallel.comm import Communicator
from parallel.sharding import EXPERT_DATA, set_record, whole_record
from parallel.state import ExpertParallel, ParallelState, destroy, initialize
from tests.distributed import run_distributed
from zero.apply import build_zero
from zero.config import ZeroConfig
from zero.experts import build_zero_with_experts, expert_data_parallel_state

NUM_EXPERTS, HIDDEN, TOPK, TOKENS, ITERS = 4, 8, 2, 6, 5
OPTIMIZER = OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=0.05)  # the clip engages: the norm matters


class TinyMoE(nn.Module):
    def __init__(self, experts: list[int]) -> None:
        super().__init__()
        self.dense = nn.Linear(HIDDEN, HIDDEN)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(7)
            self.dense.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=generator) / HIDDEN ** 0.5)
            self.dense.bias.copy_(torch.randn(HIDDEN, generator=generator) / 10)
        self.expert_ids = experts
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in experts)
        with torch.no_grad():
            for expert, linear in zip(experts, self.experts):
                generator = torch.Generator().manual_seed(100 + expert)
                linear.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=generator) / HIDDEN ** 0.5)
                set_record(linear.weight, whole_record(linear.weight.shape, replicated_over=EXPERT_DATA))

    def forward(self, dispatcher, hidden, probs, indices, target):
        expert_inputs, tokens_per_expert = dispatcher.dispatch(torch.tanh(self.dense(hidden)), probs, indices)
        chunks = expert_inputs.split(tokens_per_expert)
        output = dispatcher.combine(torch.cat([linear(chunk) for linear, chunk in zip(self.experts, chunks)]))
        return ((output - target) ** 2).mean()


def _batch(rank: int, routing: str):
    """Rank `rank`'s batch: the same every iteration, so that the loss falls as it trains."""
    generator = torch.Generator().manual_seed(rank)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator)
    scores = torch.randn(TOKENS, NUM_EXPERTS, generator=generator)
    if routing == "experts 0 and 1 only":  # EP rank 1's experts (2, 3) receive no token from anyone
        scores[:, 2:] = -1e4
    probs, indices = torch.softmax(scores, -1).topk(TOPK, dim=-1)
    return hidden, probs, indices, torch.randn(TOKENS, HIDDEN, generator=generator)


def _ep2_worker(rank, world_size, routing):
    state = initialize("cpu", 1, expert_model_parallel_size=2)
    results = {}
    for stage in (0, 1, 2, 3):
        num_local = NUM_EXPERTS // 2
        model = TinyMoE(list(range(state.experts.model_rank * num_local, (state.experts.model_rank + 1) * num_local)))
        zero = build_zero_with_experts(model, ZeroConfig(stage=stage, reduce_bucket_size=100), OPTIMIZER, state)
        dispatcher = AllToAllDispatcher(state.experts, NUM_EXPERTS, state.comm)
        losses, norms = [], []
        for iteration in range(ITERS):
            zero.reducer.zero_grad()
            loss = model(dispatcher, *_batch(rank, routing))
            zero.scale_loss(loss).backward()
            zero.reducer.finish_grad_sync()
            norms.append(zero.optimizer.step().grad_norm)
            summed = loss.detach().clone()
            dist.all_reduce(summed)
            losses.append(summed.item() / world_size)
        expert_optimizer = zero.experts.optimizer
        results[stage] = dict(losses=losses, norms=norms, expert_partition=expert_optimizer.master.numel(),
                              dense_partition=zero.dense.optimizer.master.numel(),
                              expert_group=dist.get_process_group_ranks(expert_optimizer.partition_group)
                              if expert_optimizer.partition_group is not None else None)
    destroy(state)
    return results


def _ep1_reference(world_size: int, stage: int, routing: str):
    """One process, every expert, every rank's tokens: the mean over ranks of each rank's mean loss."""
    state = ParallelState(device=torch.device("cpu"))
    model = TinyMoE(list(range(NUM_EXPERTS)))
    zero = build_zero(model, ZeroConfig(stage=stage, reduce_bucket_size=100), OPTIMIZER, state)
    dispatcher = AllToAllDispatcher(ExpertParallel(), NUM_EXPERTS, Communicator())
    losses, norms = [], []
    for iteration in range(ITERS):
        zero.reducer.zero_grad()
        loss = sum(model(dispatcher, *_batch(rank, routing)) for rank in range(world_size)) / world_size
        loss.backward()
        zero.reducer.finish_grad_sync()
        norms.append(zero.optimizer.step().grad_norm)
        losses.append(loss.item())
    return losses, norms


@pytest.mark.slow
@pytest.mark.parametrize("world_size, routing", [(2, "router"), (4, "router"), (4, "experts 0 and 1 only")])
def test_ep2_trains_as_ep1_at_zero_0_to_3(world_size, routing):
    """With "experts 0 and 1 only", EP rank 1's experts get no token on any rank: at ZeRO 3 their chunks are still
    gathered (each expert runs on its empty slice) and their zero gradients reduced, so no rank waits on another
    (DeepSpeed #4808's hang), and their AdamW step with a zero gradient is weight decay alone, as at EP 1."""
    results = run_distributed(_ep2_worker, world_size, routing, timeout=180)
    for stage in (0, 1, 2, 3):
        losses, norms = _ep1_reference(world_size, stage, routing)
        for rank, result in enumerate(results):
            assert result[stage]["losses"] == pytest.approx(losses, rel=1e-6), (stage, rank)
            assert result[stage]["norms"] == pytest.approx(norms, rel=1e-6), (stage, rank)
        assert losses[-1] < losses[0]  # it trains
        # The experts' states over the expert DP group: world 2 has none (each expert on one rank), world 4 the
        # pairs {0,2} {1,3}; at stages 1-3 each holds half of its two experts' states, the dense part 1/DP.
        expert_dp = world_size // 2
        for rank, result in enumerate(results):
            expected_group = None if expert_dp == 1 else [rank % 2, rank % 2 + 2]
            assert result[stage]["expert_group"] == (expected_group if stage >= 1 else None)
            local_expert_elements = 2 * HIDDEN * HIDDEN
            parts = expert_dp if stage >= 1 else 1
            assert result[stage]["expert_partition"] >= local_expert_elements // parts
            assert result[stage]["expert_partition"] < local_expert_elements // parts + 64 * 2  # + alignment
            assert result[stage]["dense_partition"] < (HIDDEN * HIDDEN + HIDDEN) // (world_size if stage else 1) + 64 * 2


def test_the_experts_zero_state_is_the_expert_grid():
    from parallel.state import virtual_state
    state = virtual_state(8, 2, rank=5, expert_model_parallel_size=2, expert_tensor_parallel_size=1)
    view = expert_data_parallel_state(state)
    assert (view.data_parallel_size, view.data_parallel_rank) == (state.experts.data_size, state.experts.data_rank)
    assert (view.tensor_parallel_size, view.data_parallel_size) == (1, 4) and view.comm is state.comm


def test_a_model_without_experts_is_refused():
    state = ParallelState(device=torch.device("cpu"))
    with pytest.raises(ValueError, match="no expert parameter"):
        build_zero_with_experts(nn.Linear(2, 2), ZeroConfig(stage=1), OPTIMIZER, state)
