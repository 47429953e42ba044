"""gpt/moe/dispatchers.py: the alltoall and allgather token dispatchers over expert-parallel ranks (gloo, fp32).

The specification is Megatron-Core's megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher:
permute by expert, all-to-all with input/output splits from the all-gathered tokens per expert, sort_chunks_by_idxs
to group the received rows by local expert, and the reverse on combine; MoEAllGatherTokenDispatcher: all-gather over
the expert tensor-and-model group, keep the local experts' rows, reduce-scatter the combined output) and the
expert grid of megatron/core/parallel_state.py.

"EP 1" is the same layer on one rank holding every token of the EP group, in rank order: that rank's experts see
the same rows in the same order as the EP ranks' experts do, and the sum over the K = 2 choices is in k order on
the token's rank in both (the all-gather dispatcher's reduce-scatter adds a row's two products, or one and a zero:
the same sum, as float addition of two terms commutes), so forward and backward are compared BITWISE.
"""

import pytest
import torch

from gpt.moe.dispatchers import AllGatherDispatcher, AllToAllDispatcher
from parallel.comm import Communicator
from parallel.state import ExpertParallel, destroy, initialize
from tests.distributed import run_distributed

NUM_EXPERTS, HIDDEN, TOPK, TOKENS = 4, 8, 2, 6
FLOAT32, INT64 = 4, 8
DISPATCHERS = {"alltoall": AllToAllDispatcher, "allgather": AllGatherDispatcher}


def _expert_weight(expert: int) -> torch.Tensor:
    return torch.randn(HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(100 + expert)) / HIDDEN ** 0.5


def _tokens(rank: int, routing: str):
    """Rank `rank`'s tokens, router probs, choices and the loss's weights (deterministic per rank)."""
    generator = torch.Generator().manual_seed(rank)
    count = 0 if routing == "rank 1 has no tokens" and rank == 1 else TOKENS
    hidden = torch.randn(count, HIDDEN, generator=generator)
    scores = torch.randn(count, NUM_EXPERTS, generator=generator)
    if routing == "experts 0 and 1 only":  # EP rank 1's experts (2, 3) receive nothing from anyone
        scores[:, 2:] = -1e4
    probs, indices = torch.softmax(scores, dim=-1).topk(TOPK, dim=-1)
    return hidden, probs, indices, torch.randn(count, HIDDEN, generator=generator)


def _run_layer(dispatcher, weights: dict, hidden, probs, indices, loss_weights, columns=slice(None)):
    """dispatch -> each local expert (a Linear, run even on no rows) -> combine; loss = sum(output x weights).
    With expert tensor parallelism each ETP rank holds the input `columns` of every local expert's weight (a
    row-parallel Linear: its partial output, which the dispatcher's combine sums over the ETP peers)."""
    hidden, probs = hidden.clone().requires_grad_(), probs.clone().requires_grad_()
    expert_inputs, tokens_per_expert = dispatcher.dispatch(hidden, probs, indices)
    assert all(isinstance(count, int) for count in tokens_per_expert) and len(tokens_per_expert) == len(weights)
    rows = expert_inputs.split(tokens_per_expert)
    outputs = torch.cat([chunk[:, columns] @ weights[expert].t() for chunk, expert in zip(rows, sorted(weights))])
    output = dispatcher.combine(outputs)
    (output * loss_weights).sum().backward()
    return dict(output=output.detach(), hidden_grad=hidden.grad, probs_grad=probs.grad,
                tokens_per_expert=tokens_per_expert,
                weight_grads={expert: weight.grad for expert, weight in weights.items()})


def _ep_worker(rank, world_size, kind, tp, ep, etp, routing):
    state = initialize("cpu", tensor_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    experts = state.experts
    num_local = NUM_EXPERTS // ep
    width = HIDDEN // experts.tensor_size
    columns = slice(experts.tensor_rank * width, (experts.tensor_rank + 1) * width)
    weights = {e: _expert_weight(e)[:, columns].clone().requires_grad_()
               for e in range(experts.model_rank * num_local, (experts.model_rank + 1) * num_local)}
    dispatcher = DISPATCHERS[kind](experts, NUM_EXPERTS, state.comm)
    state.comm.stats.snapshot_and_reset()
    result = _run_layer(dispatcher, weights, *_tokens(rank, routing), columns=columns)
    result["comm"] = state.comm.stats.snapshot_and_reset()
    result["columns"] = (columns.start, columns.stop)
    # the ranks whose tokens an expert here sees: the ETP x EP group's (the EP group's with ETP 1)
    result["ep_rank"], result["ep_group_ranks"] = experts.model_rank, _group_ranks(experts.tensor_and_model_group)
    destroy(state)
    # numpy arrays travel back by value (a tensor through torch's queue would share memory with a dead process)
    return {name: ({e: g.numpy() for e, g in value.items()} if name == "weight_grads" else
                   value.numpy() if isinstance(value, torch.Tensor) else value) for name, value in result.items()}


def _group_ranks(group):
    import torch.distributed as dist
    return dist.get_process_group_ranks(group) if group is not None else [dist.get_rank()]


def _ep1_reference(ranks: list[int], routing: str):
    """EP 1: one rank, every expert, the tokens of `ranks` concatenated in rank order."""
    parts = [_tokens(rank, routing) for rank in ranks]
    hidden, probs, indices, loss_weights = (torch.cat([part[i] for part in parts]) for i in range(4))
    weights = {e: _expert_weight(e).requires_grad_() for e in range(NUM_EXPERTS)}
    result = _run_layer(AllToAllDispatcher(ExpertParallel(), NUM_EXPERTS, Communicator()), weights, hidden, probs,
                        indices, loss_weights)
    bounds = [0]
    for part in parts:
        bounds.append(bounds[-1] + part[0].shape[0])
    return result, {rank: slice(bounds[i], bounds[i + 1]) for i, rank in enumerate(ranks)}


def _as_tensors(result):
    return {name: ({e: torch.from_numpy(g) for e, g in value.items()} if name == "weight_grads" else
                   torch.from_numpy(value) if hasattr(value, "dtype") else value) for name, value in result.items()}


def _check_against_ep1(results, routing, ep, bitwise=True):
    def same(ours, theirs, what):
        if bitwise:
            assert torch.equal(ours, theirs), what
        else:
            torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6, msg=str(what))

    for rank, result in enumerate(map(_as_tensors, results)):
        reference, rows = _ep1_reference(result["ep_group_ranks"], routing)
        mine = rows[rank]
        same(result["output"], reference["output"][mine], rank)
        same(result["hidden_grad"], reference["hidden_grad"][mine], rank)
        same(result["probs_grad"], reference["probs_grad"][mine], rank)
        columns = slice(*result["columns"])
        for expert, grad in result["weight_grads"].items():
            assert grad is not None
            same(grad, reference["weight_grads"][expert][:, columns], (rank, expert))
        local = list(result["weight_grads"])
        assert result["tokens_per_expert"] == [reference["tokens_per_expert"][e] for e in local]
        assert result["ep_rank"] == local[0] // (NUM_EXPERTS // ep)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["alltoall", "allgather"])
def test_ep2_equals_ep1_forward_and_backward_bitwise(kind):
    results = run_distributed(_ep_worker, 2, kind, 1, 2, 1, "router", timeout=90)
    _check_against_ep1(results, "router", ep=2)


@pytest.mark.slow
@pytest.mark.parametrize("kind, tp, ep, etp", [("alltoall", 2, 2, 1), ("allgather", 2, 2, 1), ("alltoall", 1, 4, 1),
                                               ("allgather", 1, 4, 1), ("alltoall", 1, 2, 1)])
def test_four_ranks_equal_ep1(kind, tp, ep, etp):
    """World 4: TP 2 x EP 2 (ETP 1: the EP groups are the TP groups {0,1} {2,3}), EP 4 (one expert a rank), and EP 2
    with expert data parallelism 2 (two EP groups, each its own tokens)."""
    results = run_distributed(_ep_worker, 4, kind, tp, ep, etp, "router", timeout=120)
    _check_against_ep1(results, "router", ep=ep)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["alltoall", "allgather"])
def test_tp2_ep2_with_expert_tensor_parallelism_2_equals_ep1(kind):
    """World 4, TP 2 x EP 2 x ETP 2 (ETP groups {0,1} {2,3}, EP groups {0,2} {1,3}): each ETP rank runs half of
    every local expert (row-parallel); <= 1e-6, not bitwise, since the two halves' partial products are summed
    after the fact where EP 1 runs one dot product (and the experts see the rows in another order)."""
    results = run_distributed(_ep_worker, 4, kind, 2, 2, 2, "router", timeout=120)
    _check_against_ep1(results, "router", ep=2, bitwise=False)
    comm = [result["comm"] for result in results]
    assert all(c["etp_ep"]["all_gather"] > 0 for c in comm)
    if kind == "alltoall":
        assert all(c["etp"]["all_to_all"] > 0 and c["ep"]["all_to_all"] > 0 for c in comm)


@pytest.mark.slow
@pytest.mark.parametrize("kind, routing", [("alltoall", "experts 0 and 1 only"), ("allgather", "experts 0 and 1 only"),
                                           ("alltoall", "rank 1 has no tokens")])
def test_a_rank_whose_experts_get_no_tokens_runs_forward_and_backward(kind, routing):
    """Megatron-LM #1877 (a crash when an expert gets no tokens) and DeepSpeed #4808 (a hang): EP rank 1's experts
    receive no row, or rank 1 routes nothing at all; every rank finishes, the idle experts' gradients are zeros
    (present, so a gradient reduction over them runs on every rank), and the rest equals EP 1."""
    results = run_distributed(_ep_worker, 2, kind, 1, 2, 1, routing, timeout=90)
    _check_against_ep1(results, routing, ep=2)
    results = [_as_tensors(result) for result in results]
    if routing == "experts 0 and 1 only":
        assert results[1]["tokens_per_expert"] == [0, 0]
        assert all(torch.equal(grad, torch.zeros_like(grad)) for grad in results[1]["weight_grads"].values())
    else:
        assert results[1]["output"].shape == (0, HIDDEN) and results[1]["hidden_grad"].shape == (0, HIDDEN)


@pytest.mark.slow
def test_alltoall_and_allgather_give_equal_outputs():
    alltoall = run_distributed(_ep_worker, 2, "alltoall", 1, 2, 1, "router", timeout=90)
    allgather = run_distributed(_ep_worker, 2, "allgather", 1, 2, 1, "router", timeout=90)
    for a, b in zip(map(_as_tensors, alltoall), map(_as_tensors, allgather)):
        for name in ("output", "hidden_grad", "probs_grad"):
            assert torch.equal(a[name], b[name]), name
        assert all(torch.equal(a["weight_grads"][e], b["weight_grads"][e]) for e in a["weight_grads"])


@pytest.mark.slow
def test_the_bytes_counted_are_the_rows_that_left_each_rank():
    """Forward and backward of one alltoall layer at EP 2: the counts' all-gather (E int64 per rank, ring volume
    (N-1)/N of the gathered E x N), then four all-to-alls (dispatch, combine, and their backward), each sending the
    rows bound for the other rank: the (token, choice) rows routed to its experts on the way out, the rows that
    arrived from it on the way back."""
    results = run_distributed(_ep_worker, 2, "alltoall", 1, 2, 1, "router", timeout=90)
    for rank, result in enumerate(results):
        other = 1 - rank
        _, _, my_indices, _ = _tokens(rank, "router")
        _, _, their_indices, _ = _tokens(other, "router")
        sent = int((my_indices // 2 == other).sum())  # my rows for the other rank's experts (2 a rank)
        received = int((their_indices // 2 == rank).sum())  # its rows for mine
        row = HIDDEN * FLOAT32
        # forward: dispatch sends `sent` rows, combine sends back `received`; backward: the same, reversed
        assert result["comm"]["ep"]["all_to_all"] == 2 * (sent + received) * row
        assert result["comm"]["ep"]["all_gather"] == NUM_EXPERTS * INT64 * (2 - 1)
        assert result["comm"]["dp"] == {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0, "broadcast": 0}


def test_one_expert_parallel_rank_moves_nothing_and_counts_nothing():
    """Without expert parallelism (no group) the dispatchers run no collective: the EP-1 path of the tests above."""
    comm = Communicator()
    for kind in DISPATCHERS:
        weights = {e: _expert_weight(e).requires_grad_() for e in range(NUM_EXPERTS)}
        result = _run_layer(DISPATCHERS[kind](ExpertParallel(), NUM_EXPERTS, comm), weights, *_tokens(0, "router"))
        hidden, probs, indices, _ = _tokens(0, "router")
        expected = sum(probs[:, k:k + 1] * torch.stack([hidden[t] @ _expert_weight(int(indices[t, k])).t()
                                                        for t in range(TOKENS)]) for k in range(TOPK))
        torch.testing.assert_close(result["output"], expected, rtol=1e-6, atol=1e-6)
    assert comm.stats.total() == 0 and "ep" not in comm.stats.snapshot()


@pytest.mark.parametrize("ep, experts, words", [(2, 3, "--num-experts 3 is not a multiple of "
                                                        "--expert-model-parallel-size 2")])
def test_experts_that_do_not_split_evenly_are_refused(ep, experts, words):
    with pytest.raises(ValueError, match=words):
        AllToAllDispatcher(ExpertParallel(model_size=ep), experts, Communicator())


@pytest.mark.slow
def test_the_allgather_dispatchers_bytes_are_its_ring_volumes():
    """One allgather layer at EP 2, forward and backward, each collective's ring volume (parallel/comm.py) over 2
    ranks, half of the gathered (or reduce-scattered) 2T rows: forward the tokens, probs (fp32) and choices
    (int64) all-gathered and the output reduce-scattered; backward the reverse of each (no gradient for the
    choices)."""
    results = run_distributed(_ep_worker, 2, "allgather", 1, 2, 1, "router", timeout=90)
    hidden, probs, choices = TOKENS * HIDDEN * FLOAT32, TOKENS * TOPK * FLOAT32, TOKENS * TOPK * INT64
    for result in results:
        assert result["comm"]["ep"] == {"all_to_all": 0, "all_reduce": 0, "broadcast": 0,
                                        "all_gather": hidden + probs + choices + hidden,
                                        "reduce_scatter": hidden + hidden + probs}
