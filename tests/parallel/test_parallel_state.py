"""parallel/state.py: the TP x DP grid; parallel/launch_environment.py: the launch environment (torchrun, SLURM) and
its errors."""

import warnings

import pytest
import torch
import torch.distributed as dist

from parallel.comm import Communicator
from parallel.launch_environment import LaunchEnvironment, expand_nodelist, read_launch_environment
from parallel.state import ParallelState, _warn_if_tensor_parallel_spans_nodes, destroy, initialize
from tests.distributed import run_distributed

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


@pytest.fixture
def clean_launch_env(monkeypatch):
    for variable in LAUNCH_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


@pytest.mark.parametrize("nodelist, hosts", [
    ("node7", ["node7"]),
    ("dgx[001-004,007],other5", ["dgx001", "dgx002", "dgx003", "dgx004", "dgx007", "other5"]),
    ("a[8-11]", ["a8", "a9", "a10", "a11"]),
    ("gpu-[09-10],cpu1,cpu2", ["gpu-09", "gpu-10", "cpu1", "cpu2"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
])
def test_slurm_nodelist_expansion(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["dgx[001-004", "dgx]1[", "dgx[a-b]"])
def test_malformed_nodelist_is_an_error(bad):
    with pytest.raises(ValueError, match="nodelist"):
        expand_nodelist(bad)


def test_slurm_environment_maps_to_ranks_and_first_node(clean_launch_env):
    env = {"SLURM_PROCID": "13", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5",
           "SLURM_JOB_NODELIST": "dgx[003-004]", "SLURM_NTASKS_PER_NODE": "8(x2)"}
    launch = read_launch_environment(env)
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank, launch.local_world_size,
            launch.master_addr, launch.master_port) == ("slurm", 13, 16, 5, 8, "dgx003", 29500)
    launch = read_launch_environment({**env, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"})
    assert (launch.master_addr, launch.master_port) == ("10.0.0.1", 6000)


def test_torchrun_environment_wins_over_slurm():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "host0",
           "MASTER_PORT": "1234", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "x[1-2]"}
    launch = read_launch_environment(env)
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank, launch.local_world_size,
            launch.master_addr, launch.master_port) == ("torchrun", 3, 8, 3, 4, "host0", 1234)
    assert read_launch_environment({}).launcher == "none"


def test_single_process_has_no_process_group(clean_launch_env):
    state = initialize("cpu", tensor_parallel_size=1)
    assert not dist.is_initialized()
    assert state.world_size == 1 and state.mesh is None
    assert state.tensor_parallel_group is None and state.data_parallel_group is None
    assert isinstance(state.comm, Communicator)
    destroy(state)


@pytest.mark.parametrize("world, tp, pp, message", [
    ("4", 3, 1, "--tensor-model-parallel-size 3 does not divide the 4 launched processes"),
    ("1", 0, 1, "--tensor-model-parallel-size must be at least 1"),
    ("2", 4, 1, "--tensor-model-parallel-size 4 does not divide the 2"),
    ("6", 2, 2, "--tensor-model-parallel-size 2 x --pipeline-model-parallel-size 2 does not divide the 6"),
    ("2", 1, 0, "--pipeline-model-parallel-size must be at least 1"),
])
def test_bad_grid_is_refused_before_any_work(clean_launch_env, world, tp, pp, message):
    clean_launch_env.setenv("RANK", "0")
    clean_launch_env.setenv("WORLD_SIZE", world)
    with pytest.raises(ValueError, match=message):
        initialize("cpu", tensor_parallel_size=tp, pipeline_parallel_size=pp)
    assert not dist.is_initialized()


def test_slurm_grid_error_names_the_flag(clean_launch_env):
    clean_launch_env.setenv("SLURM_PROCID", "0")
    clean_launch_env.setenv("SLURM_NTASKS", "6")
    clean_launch_env.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    with pytest.raises(ValueError, match="--tensor-model-parallel-size 4 does not divide the 6"):
        initialize("cpu", tensor_parallel_size=4)


def test_warning_only_when_tensor_parallel_spans_nodes():
    launch = LaunchEnvironment(launcher="torchrun", world_size=16, local_world_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_tensor_parallel_spans_nodes(8, torch.device("cpu"), launch, gpus_per_node=None)
    with pytest.warns(UserWarning, match="TP across nodes is slow"):
        _warn_if_tensor_parallel_spans_nodes(16, torch.device("cpu"), launch, gpus_per_node=None)


def _grid_worker(rank, world_size):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # gpus_per_node=1 pretends each rank is a node of its own: TP=2 then spans nodes.
        state = initialize("cpu", tensor_parallel_size=2, gpus_per_node=1)
    spans_nodes_warning = any("TP across nodes is slow" in str(w.message) for w in caught)
    assert state.mesh.mesh.tolist() == [[0, 1], [2, 3]]
    assert state.mesh.mesh_dim_names == ("dp", "tp")
    # The named mesh over the same groups, with a pipeline of one (parallel/mesh.py).
    assert state.dims.sizes == {"pp": 1, "dp": 2, "cp": 1, "tp": 2} and state.pipeline_parallel_group is None
    assert state.dims["tp"].group is state.mesh.get_group("tp") and state.dims["dp"].group is state.mesh.get_group("dp")
    # Which ranks share a group is read from the groups themselves: the sum of ranks over each.
    tp_sum = torch.tensor([rank])
    state.comm.all_reduce(tp_sum, state.tensor_parallel_group, "tp")
    dp_sum = torch.tensor([rank])
    state.comm.all_reduce(dp_sum, state.data_parallel_group, "dp")
    bytes_sent = state.comm.stats.snapshot_and_reset()
    result = dict(rank=state.rank, world=state.world_size, tp_rank=state.tensor_parallel_rank,
                  dp_rank=state.data_parallel_rank, tp_size=state.tensor_parallel_size,
                  dp_size=state.data_parallel_size, tp_sum=tp_sum.item(), dp_sum=dp_sum.item(),
                  tp_bytes=bytes_sent["tp"]["all_reduce"], dp_bytes=bytes_sent["dp"]["all_reduce"],
                  warned=spans_nodes_warning)
    destroy(state)
    assert not dist.is_initialized()
    return result


@pytest.mark.slow
def test_four_ranks_with_tp2_form_consecutive_tp_groups_and_strided_dp_groups():
    results = run_distributed(_grid_worker, 4, timeout=90)
    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["world"] == 4
        assert (result["tp_size"], result["dp_size"]) == (2, 2)
        assert (result["tp_rank"], result["dp_rank"]) == (rank % 2, rank // 2)
        # TP groups {0,1} {2,3}; DP groups {0,2} {1,3}.
        assert result["tp_sum"] == {0: 1, 1: 1, 2: 5, 3: 5}[rank]
        assert result["dp_sum"] == {0: 2, 1: 4, 2: 2, 3: 4}[rank]
        assert result["tp_bytes"] == result["dp_bytes"] == 2 * 8 * 1 // 2  # one int64 over 2 ranks
        assert result["warned"] == (rank == 0)  # the warning is printed once, by rank 0


def test_parallel_state_defaults_describe_one_process():
    state = ParallelState(device=torch.device("cpu"))
    assert state.is_first_rank and state.tensor_parallel_size == state.data_parallel_size == 1
    assert state.comm is not ParallelState(device=torch.device("cpu")).comm  # one counter per state
