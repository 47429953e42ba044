"""parallel/random.py: dropout streams that differ across TP ranks inside fork() and agree outside."""

import pytest
import torch
import torch.nn.functional as F

from parallel.mesh import ParallelDims
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState, initialize
from tests.distributed import run_distributed


def _tp_rank_state(tp_rank: int, tp_size: int = 2) -> ParallelState:
    # The tracker needs only the rank and the device, so TP ranks can be played in one process.
    return ParallelState(device=torch.device("cpu"), dims=ParallelDims.of_rank(tp_rank, {"tp": tp_size}))


def _draws(tracker: TensorParallelRNG) -> dict[str, torch.Tensor]:
    before = torch.rand(4)
    with tracker.fork():
        inside = torch.rand(4)
        mask = F.dropout(torch.ones(16), p=0.5, training=True)
    after = torch.rand(4)
    return {"before": before, "inside": inside, "mask": mask, "after": after}


def test_fork_differs_across_tp_ranks_and_the_default_stream_agrees():
    rank0 = _draws(TensorParallelRNG(1234, _tp_rank_state(0)))
    rank1 = _draws(TensorParallelRNG(1234, _tp_rank_state(1)))
    assert torch.equal(rank0["before"], rank1["before"]) and torch.equal(rank0["after"], rank1["after"])
    assert not torch.equal(rank0["inside"], rank1["inside"])
    assert not torch.equal(rank0["mask"], rank1["mask"])


def test_fork_leaves_the_default_stream_where_it_was():
    TensorParallelRNG(7, _tp_rank_state(0))
    expected = torch.rand(8)  # what the default stream gives with no fork in between
    tracker = TensorParallelRNG(7, _tp_rank_state(0))
    first = torch.rand(3)
    with tracker.fork():
        torch.rand(100)
    assert torch.equal(torch.cat([first, torch.rand(5)]), expected)


def test_private_stream_continues_across_forks():
    tracker = TensorParallelRNG(7, _tp_rank_state(1))
    with tracker.fork():
        expected = torch.rand(6)
    tracker = TensorParallelRNG(7, _tp_rank_state(1))
    with tracker.fork():
        first = torch.rand(2)
    torch.rand(10)
    with tracker.fork():
        second = torch.rand(4)
    assert torch.equal(torch.cat([first, second]), expected)


def test_saved_states_replay_the_same_draws():
    tracker = TensorParallelRNG(99, _tp_rank_state(1))
    torch.rand(3)
    with tracker.fork():
        torch.rand(3)
    saved = tracker.get_states()
    original = _draws(tracker)
    torch.rand(50)  # move both streams on
    with tracker.fork():
        torch.rand(50)
    tracker.set_states(saved)
    replay = _draws(tracker)
    for key in original:
        assert torch.equal(original[key], replay[key]), key


def test_forks_do_not_nest_and_states_are_complete():
    tracker = TensorParallelRNG(0, _tp_rank_state(0))
    with tracker.fork():
        with pytest.raises(RuntimeError, match="do not nest"), tracker.fork():
            torch.rand(1)
        with pytest.raises(RuntimeError, match="outside"):
            tracker.get_states()
    states = tracker.get_states()
    del states["tensor_parallel_cpu"]
    with pytest.raises(ValueError, match="tensor_parallel_cpu"):
        tracker.set_states(states)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fork_swaps_the_cuda_generator():
    device = torch.device("cuda", 0)
    draws = []
    for tp_rank in (0, 1):
        tracker = TensorParallelRNG(5, ParallelState(device=device, dims=ParallelDims.of_rank(tp_rank, {"tp": 2})))
        with tracker.fork():
            inside = torch.rand(4, device=device)
        draws.append((torch.rand(4, device=device), inside))
    assert torch.equal(draws[0][0], draws[1][0]) and not torch.equal(draws[0][1], draws[1][1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_graph_safe_tracker_draws_what_the_tensor_state_one_draws_and_a_captured_fork_replays_new_draws():
    """parallel/random.py's graph_safe mode (Megatron-Core's use_cudagraphable_rng): outside a capture the same streams
    as the tensor-state tracker, and its checkpoint states the same; inside a CUDA graph a fork registers with the
    graph, so each replay draws new numbers from the private stream, as eager forks would in turn."""
    device = torch.device("cuda", 0)
    state = ParallelState(device=device, dims=ParallelDims.of_rank(1, {"tp": 2}))
    streams = []
    for graph_safe in (False, True):
        tracker = TensorParallelRNG(5, state, graph_safe=graph_safe)
        draws = []
        for _ in range(2):
            with tracker.fork():
                draws.append(torch.rand(4, device=device))
            draws.append(torch.rand(4, device=device))
        streams.append((draws, tracker.get_states()))
    (tensor_draws, tensor_states), (safe_draws, safe_states) = streams
    assert all(torch.equal(a, b) for a, b in zip(tensor_draws, safe_draws))
    assert all(torch.equal(tensor_states[key], safe_states[key]) for key in tensor_states)

    tracker = TensorParallelRNG(5, state, graph_safe=True)
    eager = []
    for _ in range(5):
        with tracker.fork():
            eager.append(torch.rand(4, device=device))
    tracker = TensorParallelRNG(5, state, graph_safe=True)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    for generator in tracker.graph_generators():
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, stream=stream):
        with tracker.fork():
            captured = torch.rand(4, device=device)
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(captured.clone())
    assert not torch.equal(replays[0], replays[1]) and not torch.equal(replays[1], replays[2])
    # the replays continue the private stream as forks in turn would (whether the capture itself took one fork's
    # offsets is the graph's business)
    assert any(all(torch.equal(a, b) for a, b in zip(eager[start:], replays)) for start in (0, 1))


def _real_ranks_worker(rank, world_size):
    state = initialize("cpu", tensor_parallel_size=2)
    draws = _draws(TensorParallelRNG(31, state))
    return state.tensor_parallel_rank, draws


@pytest.mark.slow
def test_on_four_ranks_tp_draws_differ_only_across_tp_ranks():
    results = run_distributed(_real_ranks_worker, 4, timeout=90)
    for tp_rank, draws in results:
        assert torch.equal(draws["before"], results[0][1]["before"])
        assert torch.equal(draws["after"], results[0][1]["after"])
        # Same TP rank in another DP group: same private stream (DP rank is not part of the seed).
        same_tp_rank = [d for r, d in results if r == tp_rank]
        assert all(torch.equal(d["inside"], draws["inside"]) for d in same_tp_rank)
    assert not torch.equal(results[0][1]["inside"], results[1][1]["inside"])
