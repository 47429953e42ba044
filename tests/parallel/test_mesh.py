"""parallel/mesh.py: the named mesh ("pp", "dp", "tp") under ParallelState, in Megatron's rank order.

Megatron's order is TP fastest, then DP, then PP: NVIDIA/Megatron-LM megatron/core/parallel_state.py,
`initialize_model_parallel(..., order="tp-cp-ep-dp-pp")` (its RankGenerator lays ranks out with the first
name varying fastest; tests/unit_tests/test_parallel_state.py runs that default order). torchtitan's
ParallelDims (torchtitan/distributed/parallel_dims.py) names its mesh's dimensions the same way, pp
outermost and tp innermost."""

import pytest
import torch

from parallel.mesh import MESH_DIM_NAMES, ParallelDims, hierarchical_groups
from parallel.state import ParallelState, virtual_state


@pytest.mark.smoke
def test_world_8_tp_2_keeps_todays_layout_with_a_pipeline_of_one():
    for rank in range(8):
        state = virtual_state(8, tensor_parallel_size=2, rank=rank)
        dims = state.dims
        assert [dim.name for dim in dims.dims] == ["pp", "dp", "cp", "tp"] == list(MESH_DIM_NAMES)
        assert dims.sizes == {"pp": 1, "dp": 4, "cp": 1, "tp": 2}
        # Today's layout: TP ranks adjacent (rank % TP), DP strided (rank // TP); every rank is stage 0.
        assert dims.coordinates == {"pp": 0, "dp": rank // 2, "cp": 0, "tp": rank % 2}
        assert dims.group_ranks("tp") == [rank - rank % 2, rank - rank % 2 + 1]
        assert dims.group_ranks("dp") == [rank % 2 + 2 * i for i in range(4)]
        assert dims.group_ranks("pp") == [rank]
        assert state.pipeline_parallel_size == 1 and state.pipeline_parallel_rank == 0
        assert state.pipeline_parallel_group is None  # a group of one: its collectives are skipped
        # The flat names other modules read are views of the mesh.
        assert (state.rank, state.world_size) == (rank, 8)
        assert (state.tensor_parallel_size, state.tensor_parallel_rank) == (2, rank % 2)
        assert (state.data_parallel_size, state.data_parallel_rank) == (4, rank // 2)
        assert state.tensor_parallel_group is dims["tp"].group and state.tensor_parallel_group.size() == 2
        assert state.data_parallel_group is dims["dp"].group and state.data_parallel_group.size() == 4


def test_rank_order_with_a_pipeline_dimension():
    # PP outermost: world 8 = PP 2 x DP 2 x TP 2, rank = (pp x DP + dp) x TP + tp.
    for rank in range(8):
        dims = ParallelDims.of_rank(rank, {"pp": 2, "dp": 2, "tp": 2})
        assert dims.coordinates == {"pp": rank // 4, "dp": rank // 2 % 2, "cp": 0, "tp": rank % 2}
        assert dims.rank == rank and dims.world_size == 8
    assert ParallelDims.of_rank(5, {"pp": 2, "dp": 2, "tp": 2}).group_ranks("pp") == [1, 5]


def test_the_state_is_read_only_and_one_process_by_default():
    state = ParallelState(device=torch.device("cpu"))
    assert state.dims.sizes == {"pp": 1, "dp": 1, "cp": 1, "tp": 1} and state.rank == 0 and state.world_size == 1
    with pytest.raises(AttributeError):
        state.tensor_parallel_size = 2


@pytest.mark.parametrize("rank, sizes, words", [
    (0, {"ep": 2}, "unknown mesh dimensions"),
    (0, {"tp": 0}, "must have size >= 1"),
    (4, {"dp": 2, "tp": 2}, r"rank 4 is not in \[0, 4\)"),
])
def test_a_bad_mesh_is_refused(rank, sizes, words):
    with pytest.raises(ValueError, match=words):
        ParallelDims.of_rank(rank, sizes)


def test_context_parallel_sits_between_tp_and_dp_as_megatrons_order():
    """Megatron-Core's RankGenerator order "tp-cp-ep-dp-pp" (megatron/core/parallel_state.py): at world 8,
    TP 2 x CP 2, the CP groups stride by TP, the DP groups by TP x CP; gradients and ZeRO's partition span
    Megatron's "dp-cp" group, the DP x CP ranks at this (pp, tp), in rank order."""
    for rank in range(8):
        state = virtual_state(8, tensor_parallel_size=2, rank=rank, context_parallel_size=2)
        dims = state.dims
        assert dims.coordinates == {"pp": 0, "dp": rank // 4, "cp": rank // 2 % 2, "tp": rank % 2}
        assert dims.group_ranks("cp") == [rank % 2 + 4 * (rank // 4), rank % 2 + 4 * (rank // 4) + 2]
        assert dims.group_ranks("dp") == [rank % 4, rank % 4 + 4]
        assert (state.context_parallel_size, state.data_parallel_size) == (2, 2)
        assert (state.partition_size, state.partition_rank) == (4, (rank // 4) * 2 + rank // 2 % 2)
        assert state.partition_group.size() == 4


def test_hierarchical_groups_are_megatrons():
    """megatron/core/parallel_state.py create_hierarchical_groups' docstring: 16 ranks at sizes [2, 2, 4] give 8
    level-1 groups [g0, g1] ..., 8 level-2 groups [g0, g2], [g1, g3], [g4, g6] ... and 4 level-3 groups
    [g0, g4, g8, g12] ...; the planned (virtual) state finds a rank's group at each level the same way."""
    levels = hierarchical_groups(list(range(16)), [2, 2, 4])
    assert levels[0] == [[2 * i, 2 * i + 1] for i in range(8)]
    assert levels[1] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert levels[2] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    # CP 4 x TP 2 (world 8): CP group of rank 3 is {1, 3, 5, 7}; at sizes 2 2 its a2a group {1, 3}, its ring {3, 7}
    from parallel.context_parallel import hierarchical_cp_ranks

    inner, outer = hierarchical_cp_ranks(virtual_state(8, 2, rank=3, context_parallel_size=4,
                                                       hierarchical_context_parallel_sizes=[2, 2]))
    assert (inner.global_ranks, inner.rank, outer.global_ranks, outer.rank) == ((1, 3), 1, (3, 7), 0)
    with pytest.raises(ValueError, match="must be sizes of at least 1 whose product is --context-parallel-size 4"):
        virtual_state(8, 2, context_parallel_size=4, hierarchical_context_parallel_sizes=[4, 2])
