"""tests/distributed.py: results in rank order, and a failing, crashing or hung rank fails fast."""

import os
import time

import pytest
import torch.distributed as dist

from tests.distributed import DistributedTestError, run_distributed


def _report_environment(rank, world_size, offset):
    dist.init_process_group("gloo")  # from the env:// variables the harness set, as under torchrun
    # Both ranks past gloo's connectFullMesh before either returns: a rank that returned at once destroyed its
    # group while its peer was still connecting ("Connection closed by peer", CI under load, twice)
    dist.barrier()
    return rank + offset, dist.get_rank(), dist.get_world_size(), os.environ["LOCAL_RANK"]


def _read_variable(rank, world_size, name):
    return os.environ.get(name)


def _rank_one_raises(rank, world_size):
    dist.init_process_group("gloo")
    if rank == 1:
        raise RuntimeError("rank one gives up")
    dist.barrier()  # rank 0 would wait here forever without the harness


def _rank_one_crashes(rank, world_size):
    if rank == 1:
        os._exit(3)
    return rank


def _rank_one_hangs(rank, world_size):
    if rank == 1:
        time.sleep(600)
    return rank


@pytest.mark.slow
def test_results_come_back_in_rank_order_with_torchrun_environment():
    assert run_distributed(_report_environment, 2, 10, timeout=60) == [(10, 0, 2, "0"), (11, 1, 2, "1")]


@pytest.mark.slow
def test_an_exception_in_one_rank_fails_with_its_traceback():
    started = time.monotonic()
    with pytest.raises(DistributedTestError, match="(?s)rank 1 of 2 failed.*rank one gives up"):
        run_distributed(_rank_one_raises, 2, timeout=60)
    assert time.monotonic() - started < 30  # did not wait for the timeout


@pytest.mark.slow
def test_a_crashed_rank_fails_the_run():
    with pytest.raises(DistributedTestError, match="rank 1 exited with code 3"):
        run_distributed(_rank_one_crashes, 2, timeout=60)


@pytest.mark.slow
def test_a_hung_rank_fails_at_the_timeout():
    started = time.monotonic()
    with pytest.raises(DistributedTestError, match=r"timed out after 3 s waiting for ranks \[1\]"):
        run_distributed(_rank_one_hangs, 2, timeout=3)
    assert time.monotonic() - started < 15


def test_a_local_function_is_refused_before_any_process_starts():
    def local(rank, world_size):
        return rank
    with pytest.raises(TypeError, match="top of an importable module"):
        run_distributed(local, 2)


@pytest.mark.slow
def test_children_see_the_callers_current_environment(monkeypatch):
    # Set after the forkserver may already be running: children must still see it, as spawned ones would.
    monkeypatch.setenv("ZERO_GPT_HARNESS_PROBE", "present")
    assert run_distributed(_read_variable, 2, "ZERO_GPT_HARNESS_PROBE", timeout=60) == ["present", "present"]
