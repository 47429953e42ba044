"""parallel/comm.py: collective results, and bytes counted with the ring-algorithm formulas."""

import warnings

import pytest
import torch
import torch.distributed as dist

from parallel.comm import CommStats, Communicator, CompletedWork, ring_bytes_sent
from tests.distributed import run_distributed

FLOAT32 = 4
INT64 = 8


def test_ring_volumes():
    # Independent of the implementation: the textbook numbers for M = 1200 bytes.
    assert ring_bytes_sent("all_reduce", 1200, 4) == 1800  # 2 M 3/4
    assert ring_bytes_sent("reduce_scatter", 1200, 4) == 900  # M 3/4
    assert ring_bytes_sent("all_gather", 1200, 2) == 600  # M 1/2
    assert ring_bytes_sent("broadcast", 1200, 8, is_source=True) == 1200
    assert ring_bytes_sent("broadcast", 1200, 8, is_source=False) == 0
    assert all(ring_bytes_sent(kind, 1200, 1) == 0
               for kind in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"))
    # DeepSpeed-Ulysses' all-to-all (context parallelism's a2a): all but the rank's own 1/N leaves it
    assert ring_bytes_sent("all_to_all", 1200, 4) == 900
    with pytest.raises(ValueError, match="unknown collective"):
        ring_bytes_sent("all_to_all_v", 1200, 4)


def test_stats_snapshot_is_per_iteration_and_shaped_per_group():
    stats = CommStats()
    stats.add("dp", "reduce_scatter", 100)
    stats.add("dp", "reduce_scatter", 28)
    stats.add("tp", "all_reduce", 7)
    first = stats.snapshot_and_reset()
    assert first == {"dp": {"all_reduce": 0, "reduce_scatter": 128, "all_gather": 0, "broadcast": 0},
                     "tp": {"all_reduce": 7, "reduce_scatter": 0, "all_gather": 0, "broadcast": 0},
                     "pp": {"send": 0, "recv": 0, "all_reduce": 0, "broadcast": 0},
                     "embedding": {"all_reduce": 0}}
    assert stats.snapshot_and_reset()["dp"]["reduce_scatter"] == 0
    with pytest.raises(ValueError, match="unknown group name"):
        stats.add("xp", "all_reduce", 1)
    with pytest.raises(ValueError, match="unknown kind 'send' on the embedding group"):
        stats.add("embedding", "send", 1)


def test_the_dry_run_counts_point_to_point_messages_without_a_process_group():
    """Pipeline stages' messages (parallel/p2p.py) are counted on the "pp" group, sent and received, each the
    message's own bytes; the planner's communicator counts them with no process group and moves nothing."""
    from parallel.comm import DryRunCommunicator
    from parallel.p2p import ACTIVATION, GRADIENT, PipelineP2P

    assert not dist.is_initialized()
    comm = DryRunCommunicator(rank=1)
    p2p = PipelineP2P(torch.device("meta"), comm)
    p2p.start_slot()
    received = p2p.receive((2, 16, 32), torch.float32, peer=0, tag=ACTIVATION)
    p2p.send(torch.empty((2, 16, 32), dtype=torch.bfloat16, device="meta"), peer=2, tag=ACTIVATION)
    p2p.start_slot()
    p2p.send(torch.empty_like(received), peer=0, tag=GRADIENT)
    p2p.finish_sends()
    assert comm.stats.snapshot()["pp"] == {"send": 2 * 16 * 32 * (2 + FLOAT32), "recv": 2 * 16 * 32 * FLOAT32,
                                           "all_reduce": 0, "broadcast": 0}
    assert comm.stats.total() == 2 * 16 * 32 * (2 + FLOAT32)  # what is received is another rank's send
    assert comm.last_collective == ("send", "pp")


def test_no_group_means_no_call_and_no_bytes():
    # No process group exists in this process: any real collective would raise.
    assert not dist.is_initialized()
    comm = Communicator()
    tensor = torch.arange(6.0)
    assert comm.all_reduce(tensor, None, "tp") is None
    assert torch.equal(tensor, torch.arange(6.0))
    output = torch.empty(6)
    comm.reduce_scatter(output, tensor, None, "dp")
    assert torch.equal(output, tensor)
    output = torch.empty(2, 3)
    assert isinstance(comm.all_gather(output, tensor, None, "dp", async_op=True), CompletedWork)
    assert torch.equal(output.flatten(), tensor)
    comm.broadcast(tensor, 0, None, "dp")
    comm.barrier()
    assert comm.stats.total() == 0
    with pytest.raises(ValueError, match="expected 1 x output"):
        comm.reduce_scatter(torch.empty(4), tensor, None, "dp")


def _collectives_worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    world = dist.new_group(list(range(world_size)))
    # new_group is collective: every rank creates every singleton group, then keeps its own.
    alone = [dist.new_group([r]) for r in range(world_size)][rank]
    comm = Communicator()
    n = world_size
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        summed = torch.full((6,), float(rank + 1))
        comm.all_reduce(summed, world, "tp")
        assert torch.equal(summed, torch.full((6,), n * (n + 1) / 2))

        largest = torch.tensor([float(rank), -float(rank)])
        comm.all_reduce(largest, world, "tp", op=dist.ReduceOp.MAX)
        assert torch.equal(largest, torch.tensor([n - 1.0, 0.0]))

        # reduce-scatter: every rank contributes chunk i = (rank + 1) * i; rank r keeps chunk r summed.
        chunks = torch.stack([torch.full((3,), float((rank + 1) * i)) for i in range(n)]).flatten()
        mine = torch.empty(3)
        comm.reduce_scatter(mine, chunks, world, "dp")
        assert torch.equal(mine, torch.full((3,), float(rank * n * (n + 1) // 2)))

        gathered = torch.empty(n * 3)
        handle = comm.all_gather(gathered, torch.full((3,), float(rank)), world, "dp", async_op=True)
        handle.wait()
        assert torch.equal(gathered, torch.arange(n).float().repeat_interleave(3))

        announced = torch.full((5,), float(rank), dtype=torch.float64)
        comm.broadcast(announced, 1, world, "dp")
        assert torch.equal(announced, torch.full((5,), 1.0, dtype=torch.float64))

        unchanged = torch.full((4,), float(rank))
        comm.all_reduce(unchanged, alone, "tp")
        comm.broadcast(unchanged, rank, alone, "dp")
        assert torch.equal(unchanged, torch.full((4,), float(rank)))
        comm.barrier(world)
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert not deprecations, deprecations
    return comm.stats.snapshot_and_reset(), comm.stats.snapshot()


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_collectives_and_their_byte_counts(world_size):
    results = run_distributed(_collectives_worker, world_size, timeout=90)
    n = world_size
    for rank, (iteration, after_reset) in enumerate(results):
        # Sizes: all-reduces of 6 and 2 fp32, a reduce-scatter of n x 3 fp32 in, an all-gather of
        # n x 3 fp32 out, a broadcast of 5 fp64 from rank 1. Singleton-group calls cost nothing.
        assert iteration == {
            "tp": {"all_reduce": 2 * (6 * FLOAT32) * (n - 1) // n + 2 * (2 * FLOAT32) * (n - 1) // n,
                   "reduce_scatter": 0, "all_gather": 0, "broadcast": 0},
            "dp": {"all_reduce": 0, "reduce_scatter": (n * 3 * FLOAT32) * (n - 1) // n,
                   "all_gather": (n * 3 * FLOAT32) * (n - 1) // n,
                   "broadcast": 5 * 8 if rank == 1 else 0},
            "pp": {"send": 0, "recv": 0, "all_reduce": 0, "broadcast": 0},
            "embedding": {"all_reduce": 0},
        }, f"rank {rank}"
        assert all(count == 0 for kinds in after_reset.values() for count in kinds.values())


def test_all_to_all_counts_the_rows_that_leave_the_rank_on_the_expert_group():
    """An all-to-all's bytes are the input rows bound for other ranks (the split a rank sends itself stays); the
    expert groups' counters appear from their first collective and stay after a reset. The planner's
    communicator counts the same with a VirtualGroup (size and the planned rank's place) and moves nothing."""
    from parallel.comm import DryRunCommunicator, VirtualGroup, all_to_all_bytes_sent

    assert all_to_all_bytes_sent([3, 0, 5], group_rank=2, row_bytes=16) == 3 * 16
    comm = DryRunCommunicator(rank=5)
    assert "ep" not in comm.stats.snapshot()
    rows = torch.empty(9, 4, device="meta")
    comm.all_to_all(torch.empty(7, 4, device="meta"), rows, [2, 5], [4, 5], VirtualGroup(2, rank=1), "ep")
    assert comm.stats.snapshot()["ep"] == {"all_to_all": 4 * 4 * FLOAT32, "all_reduce": 0, "reduce_scatter": 0,
                                           "all_gather": 0, "broadcast": 0}
    assert comm.last_collective == ("all_to_all", "ep")
    comm.stats.snapshot_and_reset()
    assert comm.stats.snapshot()["ep"]["all_to_all"] == 0
    with pytest.raises(ValueError, match="do not add up"):
        comm.all_to_all(torch.empty(7, 4, device="meta"), rows, [2, 5], [4, 4], VirtualGroup(2), "ep")
    with pytest.raises(ValueError, match="3 input and 2 output splits for a group of 2"):
        comm.all_to_all(torch.empty(7, 4, device="meta"), rows, [2, 5], [4, 5, 0], VirtualGroup(2), "ep")
    with pytest.raises(ValueError, match="unknown kind 'all_to_all' on the dp group"):
        comm.all_to_all(torch.empty(7, 4, device="meta"), rows, [2, 5], [4, 5], VirtualGroup(2), "dp")


# What rank r sends rank j: SPLITS[r][j] rows. Rank 1 sends nothing at all; rank 2 receives nothing.
SPLITS = [[1, 2, 0], [0, 0, 0], [3, 1, 0]]


def _all_to_all_worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    comm = Communicator()
    input_splits = SPLITS[rank]
    output_splits = [SPLITS[source][rank] for source in range(world_size)]
    # Row i of rank r's input carries (r, i): who sent it, and which row it was.
    input = torch.tensor([[rank, i] for i in range(sum(input_splits))], dtype=torch.float32).reshape(-1, 2)
    output = torch.full((sum(output_splits), 2), -1.0)
    comm.all_to_all(output, input, output_splits, input_splits, dist.group.WORLD, "ep")
    nothing = torch.empty(0, 2)  # every split 0: the collective still runs, on no rows
    comm.all_to_all(nothing, torch.empty(0, 2), [0] * world_size, [0] * world_size, dist.group.WORLD, "ep")
    return output.tolist(), comm.stats.snapshot()["ep"]["all_to_all"]


@pytest.mark.slow
def test_gloo_all_to_all_with_uneven_and_zero_splits():
    """gloo on this torch runs all_to_all_single with uneven splits, zero splits and no rows at all (so the
    Communicator needs no padding or send/recv pairs)."""
    results = run_distributed(_all_to_all_worker, 3, timeout=90)
    for rank, (output, sent) in enumerate(results):
        expected = []
        for source in range(3):
            first = sum(SPLITS[source][:rank])
            expected += [[float(source), float(first + i)] for i in range(SPLITS[source][rank])]
        assert output == expected
        assert sent == (sum(SPLITS[rank]) - SPLITS[rank][rank]) * 2 * FLOAT32
