"""The experts' process groups (parallel/mesh.py, parallel/state.py): Megatron-Core's "parallel folding".

The oracle is Megatron-Core's own arithmetic, reimplemented here from megatron/core/parallel_state.py:
`generate_masked_orthogonal_rank_groups` and `RankGenerator.get_ranks`, with the expert generator that
`initialize_model_parallel` builds (tp = expert_tensor_parallel_size, ep = expert_model_parallel_size,
dp = world / (ETP x EP x PP), cp = 1, order "tp-cp-ep-dp-pp" -> the expert groups from get_ranks('ep'),
get_ranks('tp'), get_ranks('dp') and get_ranks('tp-ep'))."""

import pytest
import torch
import torch.distributed as dist

from parallel.mesh import expert_groups, expert_mesh_sizes
from parallel.state import destroy, initialize, virtual_state, with_expert_parallel
from tests.distributed import run_distributed


def _megatron_masked_orthogonal_rank_groups(world_size, parallel_size, mask):
    """megatron/core/parallel_state.py, generate_masked_orthogonal_rank_groups (the same steps)."""
    def prefix_product(a, init=1):
        r = [init]
        for v in a:
            init = init * v
            r.append(init)
        return r

    def decompose(index, shape):
        stride = prefix_product(shape)
        return [(index // d) % s for s, d in zip(shape, stride)]

    masked_shape = [s for s, m in zip(parallel_size, mask) if m]
    unmasked_shape = [s for s, m in zip(parallel_size, mask) if not m]
    global_stride = prefix_product(parallel_size)
    masked_stride = [d for d, m in zip(global_stride, mask) if m]
    unmasked_stride = [d for d, m in zip(global_stride, mask) if not m]
    group_size = prefix_product(masked_shape)[-1]
    ranks = []
    for group_index in range(world_size // group_size):
        group_idx = decompose(group_index, unmasked_shape)
        ranks.append([sum(x * y for x, y in zip(decompose(r, masked_shape), masked_stride))
                      + sum(x * y for x, y in zip(group_idx, unmasked_stride)) for r in range(group_size)])
    return ranks


def _megatron_expert_ranks(world, tp, pp, ep, etp, token):
    """RankGenerator(tp=etp, ep=ep, dp=world // (etp*ep*pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp").get_ranks(token)."""
    order = ["tp", "cp", "ep", "dp", "pp"]
    sizes = {"tp": etp, "cp": 1, "ep": ep, "dp": world // (etp * ep * pp), "pp": pp}
    tokens = token.split("-")
    return _megatron_masked_orthogonal_rank_groups(world, [sizes[n] for n in order], [n in tokens for n in order])


# (world, TP, PP, EP, ETP)
LAYOUTS = [(2, 1, 1, 2, 1), (4, 1, 1, 2, 1), (4, 2, 1, 2, 1), (4, 2, 1, 2, 2), (4, 2, 1, 1, 1), (4, 1, 1, 2, 2),
           (8, 2, 2, 2, 1), (8, 1, 1, 4, 2), (8, 2, 1, 4, 1), (16, 4, 2, 2, 1), (16, 2, 2, 2, 2), (16, 4, 1, 2, 4),
           (32, 2, 2, 4, 2)]


@pytest.mark.parametrize("world, tp, pp, ep, etp", LAYOUTS)
def test_expert_groups_equal_megatrons(world, tp, pp, ep, etp):
    sizes = expert_mesh_sizes({"pp": pp, "dp": world // (tp * pp), "tp": tp}, ep, etp)
    assert sizes["edp"] == world // (etp * ep * pp)
    for ours, token in ((("ep",), "ep"), (("etp",), "tp"), (("edp",), "dp"), (("ep", "etp"), "tp-ep")):
        assert expert_groups(sizes, ours) == _megatron_expert_ranks(world, tp, pp, ep, etp, token), (ours, token)
    megatron = {token: _megatron_expert_ranks(world, tp, pp, ep, etp, token) for token in ("ep", "tp", "dp")}
    for rank in range(world):
        experts = virtual_state(world, tp, rank, pipeline_parallel_size=pp, expert_model_parallel_size=ep,
                                expert_tensor_parallel_size=etp).experts
        for token, size, index in (("ep", experts.model_size, experts.model_rank),
                                   ("tp", experts.tensor_size, experts.tensor_rank),
                                   ("dp", experts.data_size, experts.data_rank)):
            mine = next(group for group in megatron[token] if rank in group)
            assert (size, index) == (len(mine), mine.index(rank)), (rank, token)
        assert experts.tensor_and_model_size == etp * ep


def test_expert_tensor_parallel_size_defaults_to_the_tensor_parallel_size():
    # Megatron-LM's validate_args: "if args.expert_tensor_parallel_size is None: ... = tensor_model_parallel_size".
    experts = virtual_state(8, 2, rank=3, expert_model_parallel_size=2).experts
    assert (experts.tensor_size, experts.model_size, experts.data_size) == (2, 2, 2)
    # Without expert parallelism the experts' grid is the dense one.
    dense = virtual_state(8, 2, rank=3)
    assert (dense.experts.model_size, dense.experts.tensor_size, dense.experts.data_size) == (1, 2, 4)
    assert (dense.experts.tensor_rank, dense.experts.data_rank) == (1, 1)


@pytest.mark.parametrize("world, tp, pp, ep, etp, words", [
    (4, 1, 1, 3, 1, "--expert-model-parallel-size 3 x --expert-tensor-parallel-size 1 does not divide the 4 ranks"),
    (8, 2, 2, 4, 2, "does not divide the 4 ranks of a pipeline stage"),
    (4, 1, 1, 0, 1, "--expert-model-parallel-size must be at least 1"),
    (4, 1, 1, 1, 0, "--expert-tensor-parallel-size must be at least 1"),
])
def test_a_grid_the_experts_cannot_fold_is_refused(world, tp, pp, ep, etp, words):
    with pytest.raises(ValueError, match=words.replace("+", r"\+")):
        virtual_state(world, tp, pipeline_parallel_size=pp, expert_model_parallel_size=ep,
                      expert_tensor_parallel_size=etp)


def _live_expert_groups(rank, world_size):
    """Which ranks share each live group, read from the groups themselves: the sum of 2^rank over each."""
    state = initialize("cpu", tensor_parallel_size=2)
    seen = {}
    for etp in (1, 2):
        experts = with_expert_parallel(state, 2, etp).experts
        for name, group in (("ep", experts.model_group), ("etp", experts.tensor_group),
                            ("edp", experts.data_group), ("etp_ep", experts.tensor_and_model_group)):
            bits = torch.tensor([2 ** rank])
            if group is not None:
                dist.all_reduce(bits, group=group)
            seen[(etp, name)] = int(bits.item())
        seen[(etp, "coordinates")] = (experts.model_rank, experts.tensor_rank, experts.data_rank)
    destroy(state)
    return seen


@pytest.mark.slow
def test_live_expert_groups_on_four_ranks_are_megatrons():
    results = run_distributed(_live_expert_groups, 4, timeout=90)
    for etp in (1, 2):
        for name, token in (("ep", "ep"), ("etp", "tp"), ("edp", "dp"), ("etp_ep", "tp-ep")):
            groups = _megatron_expert_ranks(4, 2, 1, 2, etp, token)
            for rank, seen in enumerate(results):
                mine = next(group for group in groups if rank in group)
                assert seen[(etp, name)] == sum(2 ** r for r in mine), (etp, name, rank)
    # TP 2, EP 2, ETP 1: EP groups {0,1} {2,3}, EDP {0,2} {1,3}; ETP 2: ETP {0,1} {2,3}, EP {0,2} {1,3}, EDP of one.
    assert [r[(1, "coordinates")] for r in results] == [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)]
    assert [r[(2, "coordinates")] for r in results] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]


def _deepspeed_expert_parallel_ranks(world, tp, ep, pp):
    """deepspeed/utils/groups.py (microsoft/DeepSpeed 38327e07), _get_expert_parallel_ranks with its default
    E + M + D topology (use_data_before_expert_parallel_ False): each DP group cut into runs of EP ranks (the
    expert-parallel groups), the runs zipped (the expert data-parallel groups); experts tensor-parallel over the
    TP group (its expert_tensor_parallel_world_size = tensor_parallel_size_)."""
    dp_world_size = world // (tp * pp)
    pp_stride = world // pp
    data_parallel_groups = [list(range(start + i, start + pp_stride, tp))
                            for start in range(0, world, pp_stride) for i in range(tp)]
    expert_parallel_groups, expert_data_parallel_groups = [], []
    for dp_ranks in data_parallel_groups:
        runs = [dp_ranks[i:i + ep] for i in range(0, dp_world_size, ep)]
        expert_parallel_groups.extend(runs)
        expert_data_parallel_groups.extend(list(ranks) for ranks in zip(*runs))
    return expert_parallel_groups, expert_data_parallel_groups


@pytest.mark.parametrize("world, tp, pp, ep", [(16, 2, 1, 4), (8, 1, 1, 2), (16, 2, 2, 2), (8, 2, 1, 2), (32, 4, 2, 2)])
def test_with_expert_tensor_parallelism_equal_to_tp_the_groups_are_deepspeeds(world, tp, pp, ep):
    """Megatron-DeepSpeed's --moe-expert-parallel-size builds DeepSpeed's groups; they are Megatron-Core's with the
    expert tensor-parallel size left at its default, the TP size (so the two peers agree on who holds what)."""
    sizes = expert_mesh_sizes({"pp": pp, "dp": world // (tp * pp), "tp": tp}, ep, tp)
    deepspeed_ep, deepspeed_edp = _deepspeed_expert_parallel_ranks(world, tp, ep, pp)
    assert sorted(expert_groups(sizes, ("ep",))) == sorted(deepspeed_ep)
    assert sorted(expert_groups(sizes, ("edp",))) == sorted(deepspeed_edp)
    if (world, tp, pp, ep) == (16, 2, 1, 4):  # the example in DeepSpeed's docstring
        assert [0, 2, 4, 6] in expert_groups(sizes, ("ep",)) and [9, 11, 13, 15] in expert_groups(sizes, ("ep",))
        assert [0, 8] in expert_groups(sizes, ("edp",)) and [7, 15] in expert_groups(sizes, ("edp",))


@pytest.mark.parametrize("world, tp, ep, etp, message", [
    ("4", 2, 4, None, r"--expert-model-parallel-size 4 x --expert-tensor-parallel-size 2 does not divide the 4"),
    ("4", 1, 3, 1, r"--expert-model-parallel-size 3 x --expert-tensor-parallel-size 1 does not divide the 4"),
    ("1", 1, 2, 1, r"--expert-model-parallel-size 2 x --expert-tensor-parallel-size 1 does not divide the 1"),
])
def test_an_expert_grid_that_does_not_fold_is_refused_before_any_process_group(monkeypatch, world, tp, ep, etp,
                                                                               message):
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(ValueError, match=message):
        initialize("cpu", tensor_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    assert not dist.is_initialized()
